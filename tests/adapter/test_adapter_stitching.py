"""Stitching a call from engine runs: resume prompts, budgets, segments, per-token versions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_adapter.errors import EngineFailedError
from agents_adapter.proxy.stitching import EngineRun, StitchedCall

pytestmark = pytest.mark.unit


def run(tokens: list[int], finish: str, version: int = 0) -> EngineRun:
    return EngineRun(tokens, [-0.5] * len(tokens), [version] * len(tokens), finish, version)


def test_an_ordinary_call_is_one_segment() -> None:
    call = StitchedCall([1, 2, 3], max_new_tokens=4)
    call.add("r1", run([7, 8], "stop"), 10, 20)
    assert call.finished and call.finish_reason == "stop" and call.resumed == 0
    (segment,) = call.segments
    assert (segment.resource_id, segment.start, segment.num_tokens, segment.finish_reason) == ("r1", 0, 2, "stop")


def test_preempted_call_resumes_with_partial_output_and_smaller_budget() -> None:
    call = StitchedCall([1, 2, 3], max_new_tokens=10)
    call.add("r1", run([7, 8, 9], "abort", version=3), 10, 20)
    assert not call.finished and call.remaining == 7
    assert call.next_input_ids() == [1, 2, 3, 7, 8, 9]
    call.add_failure("r2", -1, 21, 22)  # r2 refused the connection
    call.add("r3", run([5] * 7, "length", version=4), 23, 40)
    assert call.finished and call.finish_reason == "length"
    assert call.output_ids == [7, 8, 9] + [5] * 7
    assert call.versions == [3, 3, 3] + [4] * 7
    assert [(s.resource_id, s.start, s.num_tokens, s.finish_reason, s.weight_version) for s in call.segments] == [
        ("r1", 0, 3, "abort", 3), ("r2", 3, 0, "error", -1), ("r3", 3, 7, "length", 4)]


def test_preempted_exactly_at_the_budget_finishes_with_length() -> None:
    call = StitchedCall([1], max_new_tokens=2)
    call.add("r1", run([4, 5], "abort"), 0, 1)
    assert call.finished and call.finish_reason == "length"


def test_an_abort_before_any_token_leaves_the_call_to_resume() -> None:
    call = StitchedCall([1], max_new_tokens=2)
    call.add("r1", run([], "abort", version=6), 0, 1)
    assert not call.finished and call.segments[0].weight_version == 6 and call.next_input_ids() == [1]


@pytest.mark.parametrize("bad", [
    EngineRun([1, 2], [-1.0], [0, 0], "stop", 0),  # fewer logprobs than tokens
    EngineRun([1, 2, 3, 4], [-1.0] * 4, [0] * 4, "length", 0),  # over the budget
    EngineRun([1], [-1.0], [0], "weird", 0),
])
def test_a_protocol_violation_fails_the_call(bad: EngineRun) -> None:
    call = StitchedCall([1], max_new_tokens=3)
    with pytest.raises(EngineFailedError):
        call.add("r1", bad, 0, 1)


def test_truncate_at_a_stop_sequence_keeps_segments_consistent() -> None:
    call = StitchedCall([1], max_new_tokens=10)
    call.add("r1", run([7, 8, 9], "abort"), 0, 1)
    call.add("r2", run([5, 6, 4], "length", version=1), 2, 3)
    call.truncate(4)
    assert call.output_ids == [7, 8, 9, 5] and call.finish_reason == "stop" and len(call.versions) == 4
    assert [(s.resource_id, s.num_tokens) for s in call.segments] == [("r1", 3), ("r2", 1)]
    call.truncate(2)
    assert [(s.resource_id, s.num_tokens) for s in call.segments] == [("r1", 2)]
    with pytest.raises(ValueError, match="outside"):
        call.truncate(3)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(1, 30))
def test_segments_always_add_up_to_the_output(chunks: list[int], budget: int) -> None:
    call = StitchedCall([0], max_new_tokens=budget)
    for i, size in enumerate(chunks):
        if call.finished:
            break
        take = min(size, call.remaining)
        call.add(f"r{i}", run(list(range(take)), "abort", version=i), i, i + 1)
    assert sum(s.num_tokens for s in call.segments) == len(call.output_ids) == len(call.versions)
    assert all(b.start == a.start + a.num_tokens for a, b in zip(call.segments, call.segments[1:], strict=False))
    assert call.remaining >= 0 and (call.finished == (call.remaining == 0))

"""Prompts recorded by reference (schemas.prompt_refs): readers resolve them to the calls recorded in full."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.events import LLMCall, decode_event, encode_event
from schemas.prompt_refs import PromptResolver, UnresolvedPromptError, by_reference, reference_form, resolved
from schemas.registry import default_registry
from tests.factories import example
from tests.unit.trajectory.sessiongen import make_call, sessions

pytestmark = pytest.mark.unit
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_recorded(calls: list[LLMCall]) -> list[LLMCall]:
    """Each call by reference to the earlier call sharing the longest prefix, through encode/decode."""
    out = [reference_form(call, calls[:i]) for i, call in enumerate(calls)]
    return [decode_event(encode_event(c)) for c in out]  # type: ignore[misc]


def growing(n: int, session_id: str = "s1") -> list[LLMCall]:
    calls, history = [], [1, 2, 3]
    for turn in range(n):
        calls.append(make_call(f"{session_id}-c{turn}", history, [10 + turn, 11], session_id=session_id, turn=turn))
        history = [*history, 10 + turn, 11, 20 + turn]
    return calls


@FAST
@given(st.lists(sessions(), min_size=1, max_size=3))
def test_a_resolver_gives_back_every_call_as_recorded_in_full(session_lists: list[list[LLMCall]]) -> None:
    full = [c for i, calls in enumerate(session_lists) for c in
            (make_call(c.call_id, c.prompt_ids, c.output_ids, c.output_logprobs, c.output_versions,
                       session_id=f"s{i}", turn=c.turn) for c in calls)]
    recorded = [c for i in range(len(session_lists)) for c in as_recorded([f for f in full if f.session_id == f"s{i}"])]
    resolver = PromptResolver()
    by_id = {c.call_id + c.session_id: c for c in full}
    for call in recorded:
        out = resolver.resolve(call)
        assert encode_event(out) == encode_event(by_id[call.call_id + call.session_id])
        assert call.prompt_len == out.prompt_len


def test_an_extension_carries_only_what_it_adds_and_the_chain_shares_one_buffer() -> None:
    calls = growing(50)
    recorded = as_recorded(calls)
    assert not recorded[0].by_reference
    for parent, call in zip(calls, recorded[1:], strict=False):
        assert call.prompt_base_call_id == parent.call_id and len(call.prompt_ids) == 1
        assert call.prompt_base_len == parent.prompt_len + len(parent.output_ids)
    resolver = PromptResolver(calls_per_session=64)
    for call in recorded:
        resolver.resolve(call)
    held = resolver._sessions["s1"]
    assert len({id(h.buffer) for h in held.values()}) == 1


def test_a_fork_is_recorded_from_its_fork_point() -> None:
    calls = growing(5)
    rewritten = make_call("s1-r", [*list(calls[3].prompt_ids[:7]), 99, 98], [5], turn=5)
    call = reference_form(rewritten, calls)
    assert call.prompt_base_len == 7 and list(call.prompt_ids) == [99, 98]
    assert PromptResolver().resolve(calls[0]) == calls[0]
    resolver = PromptResolver()
    for c in calls:
        resolver.resolve(c)
    assert resolver.resolve(call) == rewritten


def test_a_reference_the_reader_cannot_resolve_is_an_error_naming_both_calls() -> None:
    recorded = as_recorded(growing(4))
    with pytest.raises(UnresolvedPromptError, match=r"s1-c2.*s1-c1"):
        PromptResolver().resolve(recorded[2])  # a read starting mid-session
    small = PromptResolver(calls_per_session=1)
    small.resolve(recorded[0])
    small.resolve(recorded[1])
    with pytest.raises(UnresolvedPromptError, match="s1-c0"):  # beyond what it keeps
        small.resolve(reference_form(growing(4)[2], growing(4)[:1]))
    with pytest.raises(UnresolvedPromptError, match="takes 5 ids"):
        resolved(recorded[1], b"\0" * 8)


def test_sessions_beyond_the_bound_are_forgotten() -> None:
    resolver = PromptResolver(max_sessions=2)
    for s in ("a", "b", "c"):
        resolver.resolve(growing(1, s)[0])
    assert resolver.sessions == 2
    resolver.forget("c")
    assert resolver.sessions == 1


def test_by_reference_refuses_a_base_longer_than_the_prompt() -> None:
    call = growing(1)[0]
    with pytest.raises(ValueError, match="base_len"):
        by_reference(call, "x", len(call.prompt_ids) + 1)


def test_a_v2_llmcall_decodes_in_full_form_and_resolves_to_itself() -> None:
    registry = default_registry()
    v2 = registry.versions("LLMCall")[1]
    assert v2.version == 2 and v2 is not registry.current("LLMCall")
    call = example(LLMCall, parent_call_id="p")
    fields = {f["name"] for f in v2.definition["fields"]}
    decoded = decode_event(registry.encode("LLMCall", {k: v for k, v in call.to_avro().items() if k in fields},
                                          version=v2))
    assert isinstance(decoded, LLMCall) and not decoded.by_reference and decoded.prompt_base_len == 0
    assert decoded == call and PromptResolver().resolve(decoded) == call


def test_a_base_that_calls_keep_referring_to_is_kept_least_recently_used_last() -> None:
    c0 = make_call("c0", [1, 2, 3], [4])
    forks = [make_call(f"f{k}", [1, 2, 3, 4, 50 + k], [5]) for k in range(3)]
    resolver = PromptResolver(calls_per_session=2)
    resolver.resolve(c0)
    for fork in forks:  # each refers to c0, which stays while the forks before it are dropped
        assert resolver.resolve(by_reference(fork, "c0", 4)) == fork
    with pytest.raises(UnresolvedPromptError, match="f0"):
        resolver.resolve(by_reference(make_call("g", [1, 2, 3, 4, 50, 5, 6], [7]), "f0", 6))

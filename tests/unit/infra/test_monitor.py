"""The run monitor's numbers: tagged utilisation (from activity tags) against measured work (engine
runs and train steps), and the span arithmetic behind it."""

from __future__ import annotations

import pytest

from infra.monitor import RunState, intersect_spans, merge_spans
from schemas import events as ev
from tests.factories import example

pytestmark = pytest.mark.unit


def test_span_union_and_intersection() -> None:
    assert merge_spans([(5, 9), (0, 2), (1, 3), (9, 10), (4, 4)]) == [(0, 3), (5, 10)]
    assert intersect_spans([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert intersect_spans([(0, 10)], []) == []


def _tag(rid: str, at: int, activity: str) -> ev.TagTransition:
    return example(ev.TagTransition, resource_id=rid, tag_kind=ev.TagKind.ACTIVITY, to_tags=(activity,), ts_ms=at)


def _call(rid: str, start: int, end: int) -> ev.LLMCall:
    segment = example(ev.Segment, resource_id=rid, started_ms=start, ended_ms=end)
    return example(ev.LLMCall, segments=(segment,), completed_ms=end, ts_ms=end)


def test_a_rollout_tag_without_requests_is_tagged_busy_but_not_measured_work() -> None:
    state = RunState()
    events: list[ev.Event] = [
        _tag("r0", 0, "rollout"), _tag("r1", 0, "rollout"),
        _call("r0", 0, 400), _call("r0", 200, 600),  # overlapping requests count once
        _tag("r1", 500, "train"),
        _call("r1", 100, 300),
        example(ev.TrainStepCompleted, step=1, ts_ms=900, duration_ms=300.0),  # r1 trains 600..900
        _tag("r1", 950, "idle"),
        example(ev.TrainStepCompleted, step=2, ts_ms=990, duration_ms=20.0),  # not on r1's train time
        _tag("r0", 1000, "rollout"),
    ]
    for e in events:
        state.apply(e)
    assert state.end_ms == 1000
    assert state.utilisation() == {"r0": (1.0, 0.0), "r1": (0.95, 0.05)}
    assert state.work_share() == {"r0": pytest.approx(0.6), "r1": pytest.approx(0.5)}
    assert state.rollout_work_share() == {"r0": pytest.approx(0.6), "r1": pytest.approx(0.2)}  # r1's engine: 100..300


def test_calls_in_no_trajectory_are_tracked_whichever_topic_comes_first() -> None:
    state = RunState()
    a, b, c = (example(ev.LLMCall, call_id=i) for i in ("a", "b", "c"))
    state.apply(a)
    state.apply(example(ev.Trajectory, call_ids=("a", "b")))  # b's trajectory before b's call
    assert state.unassembled == set()
    state.apply(b)
    state.apply(c)
    assert state.unassembled == {"c"} and state.assembled_early == set()


def test_the_summary_compares_first_and_last_step_metrics_and_says_what_the_collapse_guard_saw() -> None:
    state = RunState()
    assert state.health_first_last(3) == {} and state.collapse_verdict() == "never fired"
    lengths = [30.0, 40.0, 70.0, 80.0]
    for step, length in enumerate(lengths, start=1):
        signals = ("length_runaway: 100%+ truncated",) if length == 80.0 else ()
        state.apply(example(ev.TrainStepCompleted, step, step=step, response_length_mean=length, entropy=1.0,
                            truncated_fraction=length / 80, filtered_group_ids=(f"g{step}",),
                            collapse_signals=signals))
    state.apply(example(ev.TrainStepCompleted, 9, step=4, response_length_mean=80.0,  # a repeat of step 4
                        filtered_group_ids=("g4",)))
    health = state.health_first_last(2)
    assert health["response_length_mean"] == (35.0, 75.0)
    assert health["truncated_fraction"] == pytest.approx((0.4375, 0.9375))
    assert health["entropy"] == (1.0, 1.0)
    assert len(state.filtered_groups) == 4
    assert state.collapse_verdict() == "fired on 1 step(s), first at step 4; step 4: length_runaway: 100%+ truncated"


def test_the_reward_of_every_session_by_the_version_it_started_under() -> None:
    """Dynamic sampling trains only the groups whose samples disagree: the trained batch's reward is
    not the policy's, the sessions' rewards by version are (held-out sessions and repeats left out)."""
    state = RunState()
    sessions = [("t1", "g1", 0, 1.0), ("t2", "g1", 0, 0.0), ("t3", "g2", 1, 1.0), ("t3", "g2", 1, 1.0),
                ("t4", "heldout/demo/step-0/x", 1, 0.0), ("t5", "g3", 2, 0.5)]
    for tid, gid, version, reward in sessions:
        state.apply(example(ev.Trajectory, trajectory_id=tid, group_id=gid, min_version=version, reward=reward))
    assert state.rollout_rewards() == [(0, 0.5), (1, 1.0), (2, 0.5)]
    assert state.trajectories == 5  # a re-published trajectory counts again, its reward once


def test_progress_is_the_figures_follow_reads_and_the_rate_counts_late_arrivals_in_the_window() -> None:
    """`follow` reads `progress()` every second instead of a deep copy of the state: the same figures, and the
    20 s rate scanned from the newest call still counts a call that arrived out of completion order."""
    state = RunState()
    for end in (1_000, 30_000, 50_000, 47_000, 60_000):  # 47_000 arrives after 50_000 (another partition)
        state.apply(_call("r0", end - 500, end))
    naive = sum(n for t, n in state.output_tokens if t >= state.output_tokens[-1][0] - 20_000) / 20.0
    progress = state.progress()
    assert progress.tokens_per_s == state.tokens_per_s == naive > 0
    assert (progress.calls, progress.steps, progress.version, progress.progress_ms) == (5, 0, 0, 60_000)

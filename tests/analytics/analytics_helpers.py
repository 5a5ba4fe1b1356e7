"""Shared by the analytics tests: hand-made events with known answers, and feeding events to a store."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from bus.consumer import Received
from bus.topics import topic_of
from infra.analytics.sink import AnalyticsWriter
from infra.analytics.store import AnalyticsStore
from schemas import events as ev
from schemas.events import TagKind
from schemas.packed import Float32s, Int32s

T0 = 1_700_000_040_000  # a whole minute (ms), so 30 s and 60 s buckets start here
_offsets: dict[tuple[str, int], itertools.count[int]] = {}
_calls = itertools.count()


def received(event: ev.Event, offset: int | None = None, partition: int = 0, prefix: str = "sf.") -> Received:
    """`event` as the sink would read it from its catalog topic (offsets count up per topic)."""
    topic = prefix + topic_of(type(event)).name
    if offset is None:
        offset = next(_offsets.setdefault((topic, partition), itertools.count()))
    return Received(event=event, topic=topic, partition=partition, offset=offset, key=event.key,
                    timestamp_ms=event.ts_ms)


def ingest(store: AnalyticsStore, events: Iterable[ev.Event]) -> AnalyticsWriter:
    """Writes events through the sink's writer (rows, then ledger), as the sink does."""
    writer = AnalyticsWriter(store)
    for e in events:
        writer.add(received(e))
    writer.flush()
    return writer


def segment(resource: str, version: int, tokens: int, started_ms: int, ended_ms: int, start: int = 0,
            finish: str = "stop") -> ev.Segment:
    return ev.Segment(resource_id=resource, weight_version=version, start=start, num_tokens=tokens,
                      finish_reason=finish, started_ms=started_ms, ended_ms=ended_ms)


def llm_call(session: str, agent: str, segments: Sequence[ev.Segment], drift: bool = False, prompt: int = 5,
             ts_ms: int = T0, **kw: Any) -> ev.LLMCall:
    n = sum(s.num_tokens for s in segments)
    versions = [s.weight_version for s in segments for _ in range(s.num_tokens)]
    return ev.LLMCall(
        call_id=kw.pop("call_id", f"call-{next(_calls)}"), session_id=session, agent_id=agent,
        model="m", turn=kw.pop("turn", 0), prompt_ids=Int32s(range(prompt)), output_ids=Int32s(range(n)),
        output_logprobs=Float32s([-0.5] * n), output_versions=Int32s(versions),
        finish_reason=segments[-1].finish_reason, segments=tuple(segments), request_ms=ts_ms - 1000,
        completed_ms=ts_ms, drift=drift, ts_ms=ts_ms, correlation_id=session, **kw,
    )


def activity(resource: str, at_s: float, from_tag: str, to_tag: str) -> ev.TagTransition:
    return ev.TagTransition(resource_id=resource, tag_kind=TagKind.ACTIVITY, from_tags=(from_tag,),
                            to_tags=(to_tag,), cause="test", ts_ms=T0 + int(at_s * 1000))


def timeline(resource: str, steps: Sequence[tuple[float, str]]) -> list[ev.TagTransition]:
    """Activity transitions of one resource: [(at_s, activity), ...] starting from idle."""
    out, current = [], "idle"
    for at_s, act in steps:
        out.append(activity(resource, at_s, current, act))
        current = act
    return out


def train_completed(step: int, new_version: int, histogram: Sequence[int] = (), trajectories: Sequence[str] = (),
                    reward: float = 0.5, loss: float = 0.1) -> ev.TrainStepCompleted:
    return ev.TrainStepCompleted(
        run_id="run", step=step, new_version=new_version, loss=loss, reward_mean=reward, kl=0.01,
        clip_fraction=0.2, staleness_histogram=tuple(histogram), num_tokens=100 * step,
        trajectory_ids=tuple(trajectories), duration_ms=1000.0 + step, ts_ms=T0 + step * 1000,
    )


def trajectory(trajectory_id: str, min_version: int, max_version: int) -> ev.Trajectory:
    return ev.Trajectory(
        trajectory_id=trajectory_id, session_id=f"s-{trajectory_id}", agent_id="a", reward=1.0,
        status="completed", min_version=min_version, max_version=max_version, tokens_in_calls=10,
        tokens_in_tree=8, ts_ms=T0,
    )

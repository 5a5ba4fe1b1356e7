"""The topic catalog: names, partitions, keys, retention and the events each carries.

Who reads and writes each topic: docs/architecture.md, "Topics".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bus.errors import TopicError
from schemas import events as ev


@dataclass(frozen=True)
class TopicSpec:
    """One catalog topic.

    name: without the configured prefix. key: what the Kafka key is (ordering holds per key).
    retention_ms: -1 keeps the log forever (it is the system of record); compacted topics keep the
    last event per key.
    """

    name: str
    partitions: int
    key: str
    events: tuple[type[ev.Event], ...]
    retention_ms: int = -1
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.retention_ms),
            "cleanup.policy": "compact" if self.compacted else "delete",
            "max.message.bytes": str(32 * 1024 * 1024),
        }


CATALOG: Final[tuple[TopicSpec, ...]] = (
    TopicSpec("llm.calls", 4, "session", (ev.LLMCall,)),
    TopicSpec("sessions", 4, "session", (ev.SessionStarted, ev.SessionEnded)),
    TopicSpec("trajectories", 4, "task group", (ev.Trajectory, ev.BatchReady)),
    TopicSpec("tasks", 2, "task", (ev.TaskDispatched, ev.TaskCompleted)),
    TopicSpec("resources", 1, "resource", (ev.ResourceRegistered, ev.Heartbeat, ev.ResourceLost)),
    TopicSpec("scheduler", 1, "resource", (ev.TagTransition, ev.Preemption, ev.Assignment,
                                           ev.SchedulerObserved, ev.SchedulerCheckpoint)),
    TopicSpec("control", 1, "resource", (ev.PauseRollout, ev.ResumeRollout, ev.LoadWeights, ev.ControlAck)),
    TopicSpec("weights", 1, "model", (ev.WeightsPublished, ev.WeightsLoaded,
                                      ev.WeightSyncStarted, ev.WeightSyncCompleted)),
    TopicSpec("train", 1, "run", (ev.TrainStepStarted, ev.TrainStepCompleted, ev.TrainData, ev.EvalCompleted)),
    TopicSpec("metrics", 2, "service", (ev.MetricSample,), retention_ms=7 * 24 * 3600 * 1000),
    TopicSpec("dlq", 1, "source topic:partition:offset", (ev.DeadLetter,)),
)
# The scheduler's decisions are ordered across resources (one partition for resources, scheduler,
# control, weights and train), so replaying them rebuilds the same pool state. The scheduler's
# journal (SchedulerObserved, SchedulerCheckpoint) lives on `scheduler` too: one partition, one order.

_BY_NAME: Final = {t.name: t for t in CATALOG}
_BY_EVENT: Final = {e: t for t in CATALOG for e in t.events}


def spec(name: str) -> TopicSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TopicError(f"no catalog topic {name!r}; known: {sorted(_BY_NAME)}") from None


def topic_of(event_type: type[ev.Event]) -> TopicSpec:
    try:
        return _BY_EVENT[event_type]
    except KeyError:
        raise TopicError(f"event {event_type.__name__} has no catalog topic") from None

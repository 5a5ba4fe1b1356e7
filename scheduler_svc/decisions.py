"""Observations the core consumes and decisions it returns: plain frozen dataclasses.

The service shell turns observations from Kafka (resources, weights, train, llm.calls topics) into
these types, calls `Scheduler.handle`, and publishes each returned decision as the matching event of
`schemas/events.py`. The core never reads a clock: every observation carries its time `t` (seconds).

A recorded log is the sequence of observations and decisions in the order `handle` saw and returned
them; `Scheduler.from_log` rebuilds an identical scheduler from it (event sourcing). Decisions
therefore carry every value their `apply` needs (ids, versions, tags), never references to live state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.roofline import DeviceSpec

# --------------------------------------------------------------------------------------------------
# Observations (inputs)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceRegistered:
    """A resource joined (or re-joined after a crash): its engine is up with `loaded_version` weights."""

    t: float
    resource_id: str
    device: DeviceSpec
    loaded_version: int | None = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Liveness of a resource. Heartbeats of a resource already declared lost are ignored: its engine
    state is unknown, so it comes back by registering again (ResourceRegistered)."""

    t: float
    resource_id: str


@dataclass(frozen=True, slots=True)
class ResourceDown:
    """An outside report (orchestrator, engine crash handler) that a resource is gone."""

    t: float
    resource_id: str
    reason: str = "reported_down"


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: lets the core fire heartbeat and batch timeouts without a clock of its own."""

    t: float


@dataclass(frozen=True, slots=True)
class SampleCompleted:
    """One sample (trajectory) of a dispatched group is finished. Duplicates are ignored.

    `token_versions` is the sample's generated tokens per policy version, ``((version, tokens), ...)``,
    as the trajectory manager recorded them (the per-token versions of its LLM calls). Under partial
    rollout a sample that spans a weight sync has tokens at several versions; the staleness bound
    applies to its oldest one. Empty (a shell that does not report versions): all `n_tokens` count
    at the version the group was dispatched under, which is never newer than the truth.
    """

    t: float
    group_id: str
    sample_index: int
    n_tokens: int = 0
    token_versions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TrainStepCompleted:
    """The trainer finished the step of `assignment_id` and published weights `version`.

    With dynamic sampling the trainer left `filtered` of the step's groups untrained (zero reward
    variance: done, nothing to learn) and may have trained complete groups no step was handed yet in
    their place (`added_group_ids`: consumed by this step, never to be handed to another)."""

    t: float
    assignment_id: str
    step: int
    version: int
    filtered: int = 0
    added_group_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TrainStepSkipped:
    """The trainer ran nothing for the step of `assignment_id` (every group untrainable, or the step
    refused by its non-finite guard): the step ends without a new version, its groups are aborted
    (dispatched again within `max_regenerations`, else dropped) and the step is planned again."""

    t: float
    assignment_id: str
    step: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class WeightsLoaded:
    """A rollout engine finished loading `version` (acknowledgement of LoadWeights)."""

    t: float
    resource_id: str
    version: int


# --------------------------------------------------------------------------------------------------
# Decisions (outputs)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TagTransition:
    """A capability or activity tag of one resource changes (tags as sorted tuples)."""

    resource_id: str
    tag_kind: str  # "capability" | "activity"
    from_tags: tuple[str, ...]
    to_tags: tuple[str, ...]
    cause: str
    #: a cost-aware decision's estimates (benefit vs cost), so an operator can replay why
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ResourceLost:
    """The pool stops using a resource (heartbeat timeout or a ResourceDown report)."""

    resource_id: str
    cause: str
    last_heartbeat: float


@dataclass(frozen=True, slots=True)
class Assignment:
    """An SPMD task on a set of resources. Train data arrive separately as TrainData decisions."""

    assignment_id: str
    task_kind: str
    resource_ids: tuple[str, ...]
    cause: str
    step: int | None = None
    policy_version: int | None = None
    work: tuple[str, ...] = ()
    #: a cost-aware decision's estimates (benefit vs cost), so an operator can replay why
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Preemption:
    """An assignment is stopped; `handed_back` is the work it held, returned to the scheduler."""

    assignment_id: str
    task_kind: str
    resource_ids: tuple[str, ...]
    cause: str
    by_assignment_id: str | None
    handed_back: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PauseRollout:
    """'in_place': keep running requests and continue them after new weights (partial rollout);
    'abort': return partial outputs so the adapter continues the calls on another resource."""

    resource_id: str
    mode: str  # "in_place" | "abort"
    cause: str


@dataclass(frozen=True, slots=True)
class LoadWeights:
    resource_id: str
    version: int
    sync_id: str
    cause: str


@dataclass(frozen=True, slots=True)
class ResumeRollout:
    resource_id: str
    version: int
    cause: str


@dataclass(frozen=True, slots=True)
class WeightSyncStarted:
    """A group of resources loads `version`; they resume together once every one acknowledged."""

    sync_id: str
    version: int
    resource_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WeightSyncCompleted:
    sync_id: str
    version: int
    resource_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TrainData:
    """Groups handed to the running train step; `final` closes its batch (micro-batches stream in).

    `group_versions[i]` is the oldest policy version among the tokens of group i (its dispatch
    version when no token versions were reported), so ``step - group_versions[i]`` is the largest
    token lag in that group. `token_lags` is the histogram ``((lag, tokens), ...)`` of every
    generated token handed over here: what the trainer trains on, by staleness.
    """

    assignment_id: str
    step: int
    group_ids: tuple[str, ...]
    group_versions: tuple[int, ...]
    final: bool
    token_lags: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TaskDispatched:
    """The streaming loader hands one task to the agents: `n_samples` rollouts form a GRPO group."""

    task_id: str
    group_id: str
    n_samples: int
    payload: Mapping[str, Any] = field(default_factory=dict)
    policy_version: int = 0
    position: int = 0  # index in the (epoch-repeated) dataset order; rebuilds the loader's cursor
    #: 0 for a task's first dispatch; k > 0 when the group is re-generated after its k-th abort
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class TaskCompleted:
    task_id: str
    group_id: str
    n_samples: int
    policy_version: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class TaskAborted:
    """A group will not be trained: its sessions are cancelled and everything it generated is
    discarded. With `regenerate` the task is dispatched again under the current version
    (``TaskDispatched.attempt`` + 1); otherwise it is dropped from this epoch. `cause`:
      * ``staleness_bound``: it was still rolling out when the last step allowed to take its oldest
        tokens closed its batch (only policies with ``straggler="abort"``);
      * ``group_timeout``: its samples had not all reported ``group_timeout_s`` after its dispatch;
      * ``untrainable``: it was fed to a step the trainer skipped (TrainStepSkipped).
    A shell without a dedicated event can publish it as ``TaskCompleted(status="aborted" | "dropped")``."""

    task_id: str
    group_id: str
    n_samples: int
    policy_version: int
    cause: str
    regenerate: bool
    attempt: int = 0
    n_tokens: int = 0  # tokens of the group's samples that had already completed (known waste)


Observation = (
    ResourceRegistered
    | Heartbeat
    | ResourceDown
    | Tick
    | SampleCompleted
    | TrainStepCompleted
    | TrainStepSkipped
    | WeightsLoaded
)
Decision = (
    TagTransition
    | ResourceLost
    | Assignment
    | Preemption
    | PauseRollout
    | LoadWeights
    | ResumeRollout
    | WeightSyncStarted
    | WeightSyncCompleted
    | TrainData
    | TaskDispatched
    | TaskCompleted
    | TaskAborted
)
Record = Observation | Decision

OBSERVATION_TYPES: tuple[type, ...] = (
    ResourceRegistered,
    Heartbeat,
    ResourceDown,
    Tick,
    SampleCompleted,
    TrainStepCompleted,
    TrainStepSkipped,
    WeightsLoaded,
)

"""Agent sessions, the LLM calls inside them, the trajectories they become, and the tasks they work on.

Topics `llm.calls`, `sessions`, `trajectories`, `tasks` (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from schemas.envelope import Event, Record, packed
from schemas.packed import Float32s, Int32s, UInt8s

#: The group id of every held-out evaluation session starts with this (infra/evaluation.py). Such a group
#: is never trained on: the scheduler never dispatched it (its train steps only name groups it dispatched)
#: and the trainer buffers none of its trajectories, so neither dynamic sampling nor a standalone step
#: can pick it up even if it completed.
HELD_OUT_GROUP_PREFIX = "heldout/"


def is_held_out(group_id: str) -> bool:
    """The group is a held-out evaluation's (never trained on)."""
    return group_id.startswith(HELD_OUT_GROUP_PREFIX)


class SessionStatus(enum.StrEnum):
    COMPLETED = "completed"  # the agent reported its reward
    FAILED = "failed"  # the agent gave up or crashed; reward as reported (often 0)
    ABORTED = "aborted"  # dropped by an operator or a drain
    TIMEOUT = "timeout"  # never ended: closed by the trajectory processor's TTL


@dataclass(frozen=True, kw_only=True)
class Segment(Record):
    resource_id: str
    weight_version: int
    start: int
    num_tokens: int
    finish_reason: str
    started_ms: int
    ended_ms: int


@dataclass(frozen=True, kw_only=True)
class TrajectoryNode(Record):
    node_id: int
    parent: int
    token_ids: Int32s = packed(Int32s)
    loss_mask: UInt8s = packed(UInt8s)
    logprobs: Float32s = packed(Float32s)
    versions: Int32s = packed(Int32s)


@dataclass(frozen=True, kw_only=True)
class LLMCall(Event):
    call_id: str
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    model: str
    turn: int
    prompt_ids: Int32s = packed(Int32s)
    output_ids: Int32s = packed(Int32s)
    output_logprobs: Float32s = packed(Float32s)
    output_versions: Int32s = packed(Int32s)
    finish_reason: str
    segments: tuple[Segment, ...] = ()
    request_ms: int
    completed_ms: int
    drift: bool = False
    parent_call_id: str = ""
    prompt_base_call_id: str = ""
    prompt_base_len: int = 0

    @property
    def key(self) -> str:
        return self.session_id

    @property
    def prompt_len(self) -> int:
        """Tokens of the whole prompt, whether recorded in full or by reference (`schemas.prompt_refs`)."""
        return self.prompt_base_len + len(self.prompt_ids)

    @property
    def by_reference(self) -> bool:
        """Whether the prompt's first ids are another call's (`schemas.prompt_refs` resolves them)."""
        return bool(self.prompt_base_call_id)


@dataclass(frozen=True, kw_only=True)
class SessionStarted(Event):
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.session_id


@dataclass(frozen=True, kw_only=True)
class SessionEnded(Event):
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    reward: float
    status: SessionStatus = SessionStatus.COMPLETED
    num_calls: int = 0

    @property
    def key(self) -> str:
        return self.session_id


@dataclass(frozen=True, kw_only=True)
class Trajectory(Event):
    trajectory_id: str
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    reward: float
    status: str
    nodes: tuple[TrajectoryNode, ...] = ()
    call_ids: tuple[str, ...] = ()
    min_version: int
    max_version: int
    tokens_in_calls: int
    tokens_in_tree: int
    drift_calls: int = 0

    @property
    def key(self) -> str:
        return self.group_id or self.session_id


@dataclass(frozen=True, kw_only=True)
class BatchReady(Event):
    group_id: str
    task_id: str
    trajectory_ids: tuple[str, ...] = ()
    num_samples: int
    min_version: int
    max_version: int
    ready_groups: int = 0

    @property
    def key(self) -> str:
        return self.group_id


@dataclass(frozen=True, kw_only=True)
class TaskDispatched(Event):
    task_id: str
    group_id: str
    n_samples: int
    payload: str
    policy_version: int
    seq: int

    @property
    def key(self) -> str:
        return self.task_id


@dataclass(frozen=True, kw_only=True)
class TaskCompleted(Event):
    task_id: str
    group_id: str
    num_samples: int
    mean_reward: float
    status: str

    @property
    def key(self) -> str:
        return self.task_id

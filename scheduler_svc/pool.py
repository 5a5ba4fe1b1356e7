"""The abstract resource pool: capability tags, one activity tag, train_priority, and assignments.

Planning methods (`plan_*`) read the pool and return decisions without changing anything; `apply`
is the only mutator and accepts observations and decisions alike, so a pool rebuilt by applying a
recorded log equals the original. `epoch` counts changes so callers can cache derived views.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.decisions import (
    Assignment,
    Decision,
    Heartbeat,
    PauseRollout,
    Preemption,
    Record,
    ResourceLost,
    ResourceRegistered,
    TagTransition,
    TrainData,
    TrainStepCompleted,
    TrainStepSkipped,
    WeightsLoaded,
)
from scheduler_svc.errors import CapabilityError, ConfigError, ReplayError, UnknownResourceError
from scheduler_svc.roofline import DeviceSpec, train_priority
from scheduler_svc.tags import (
    ACTIVITY,
    CAPABILITY,
    IDLE,
    OFFLINE,
    ROLLOUT,
    TASK_KINDS,
    WEIGHT_SYNC,
    sorted_tags,
)


@dataclass
class Resource:
    resource_id: str
    device: DeviceSpec
    train_priority: float
    registered_seq: int
    capabilities: frozenset[str] = frozenset()
    activity: str = IDLE
    alive: bool = True
    last_heartbeat: float = 0.0
    assignment_id: str | None = None
    weights_version: int | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "device": self.device.kind,
            "train_priority": round(self.train_priority, 9),
            "registered_seq": self.registered_seq,
            "capabilities": sorted_tags(self.capabilities),
            "activity": self.activity,
            "alive": self.alive,
            "last_heartbeat": self.last_heartbeat,
            "assignment_id": self.assignment_id,
            "weights_version": self.weights_version,
        }


@dataclass
class AssignmentState:
    assignment_id: str
    task_kind: str
    resource_ids: tuple[str, ...]
    step: int | None
    policy_version: int | None
    work: list[str] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        return {
            "task_kind": self.task_kind,
            "resource_ids": self.resource_ids,
            "step": self.step,
            "policy_version": self.policy_version,
            "work": tuple(self.work),
        }


class ResourcePool:
    def __init__(self) -> None:
        self.resources: dict[str, Resource] = {}
        self.assignments: dict[str, AssignmentState] = {}
        self.next_assignment_seq = 0
        #: bumps on every change; callers key caches on it
        self.epoch = 0
        #: bumps on changes that can make placement or resume work (joins, losses, tag changes, ends)
        self.structure_epoch = 0
        #: alive rollout-tagged resources serving or reloading for rollout (the loader's capacity)
        self.serving_count = 0
        self._registrations = 0

    # ---------------------------------------------------------------------------------- queries

    def get(self, resource_id: str) -> Resource:
        try:
            return self.resources[resource_id]
        except KeyError:
            raise UnknownResourceError(f"unknown resource {resource_id!r}") from None

    def alive(self) -> list[Resource]:
        return [r for r in self.resources.values() if r.alive]

    def with_capability(self, capability: str) -> list[Resource]:
        """Alive resources carrying `capability`, in registration order."""
        return [r for r in self.resources.values() if r.alive and capability in r.capabilities]

    def idle_with_capability(self, capability: str) -> list[Resource]:
        return [r for r in self.with_capability(capability) if r.assignment_id is None and r.activity == IDLE]

    @staticmethod
    def ranked_for_training(resources: Iterable[Resource]) -> list[Resource]:
        """Highest train_priority first; registration order breaks ties (deterministic)."""
        return sorted(resources, key=lambda r: (-r.train_priority, r.registered_seq))

    def expired(self, now: float, timeout_s: float) -> list[str]:
        """Alive resources whose last heartbeat is older than `timeout_s`."""
        return [r.resource_id for r in self.resources.values() if r.alive and now - r.last_heartbeat > timeout_s]

    def assignment_of(self, resource_id: str) -> AssignmentState | None:
        aid = self.get(resource_id).assignment_id
        return None if aid is None else self.assignments[aid]

    def next_assignment_id(self) -> str:
        return f"a{self.next_assignment_seq}"

    # ---------------------------------------------------------------------------------- planners

    def plan_assignment(
        self,
        task_kind: str,
        resource_ids: Sequence[str],
        *,
        cause: str,
        step: int | None = None,
        policy_version: int | None = None,
        work: Sequence[str] = (),
        reason: str = "",
    ) -> list[Decision]:
        """Assign one SPMD task to `resource_ids`, preempting whatever they run.

        A preempted assignment is stopped as a whole (an SPMD task cannot lose a member and go on);
        its work is handed back in the Preemption, its rollout engines are told to abort (partial
        outputs go back to the adapter), and members outside the new set fall back to idle.
        """
        if task_kind not in TASK_KINDS:
            raise ConfigError(f"task_kind must be one of {sorted(TASK_KINDS)}, got {task_kind!r}")
        if not resource_ids:
            raise CapabilityError(f"an assignment of {task_kind!r} needs at least one resource")
        if len(set(resource_ids)) != len(resource_ids):
            raise CapabilityError(f"duplicate resource ids in assignment: {list(resource_ids)!r}")
        for rid in resource_ids:
            r = self.get(rid)
            if not r.alive:
                raise CapabilityError(f"resource {rid!r} is offline; cannot assign {task_kind!r}")
            if task_kind not in r.capabilities:
                raise CapabilityError(
                    f"resource {rid!r} lacks capability {task_kind!r} (has {sorted_tags(r.capabilities)})"
                )
        new_id = self.next_assignment_id()
        targets = set(resource_ids)
        out: list[Decision] = []
        seen: set[str] = set()
        for rid in resource_ids:
            aid = self.resources[rid].assignment_id
            if aid is None or aid in seen:
                continue
            seen.add(aid)
            out.extend(self.plan_preemption(aid, cause=cause, by_assignment_id=new_id, keep=targets))
        for rid in resource_ids:
            activity = self.resources[rid].activity
            if activity == WEIGHT_SYNC and self.resources[rid].assignment_id is None and task_kind != ROLLOUT:
                # loading weights to go back to rollout: the proxy may already have queued requests
                # there, which would wait out the whole task (a step waiting on them never ends)
                out.append(PauseRollout(rid, "abort", cause))
            if activity != task_kind:
                out.append(TagTransition(rid, ACTIVITY, (activity,), (task_kind,), cause))
        out.append(Assignment(new_id, task_kind, tuple(resource_ids), cause, step, policy_version, tuple(work), reason))
        return out

    def plan_preemption(
        self,
        assignment_id: str,
        *,
        cause: str,
        by_assignment_id: str | None = None,
        keep: set[str] | frozenset[str] = frozenset(),
    ) -> list[Decision]:
        """Stop an assignment; members not in `keep` (and alive) go idle."""
        a = self.assignments[assignment_id]
        out: list[Decision] = [
            Preemption(a.assignment_id, a.task_kind, a.resource_ids, cause, by_assignment_id, tuple(a.work))
        ]
        for rid in a.resource_ids:
            r = self.resources[rid]
            if not r.alive:
                continue
            if a.task_kind == ROLLOUT:
                out.append(PauseRollout(rid, "abort", cause))
            if rid not in keep and r.activity != IDLE:
                out.append(TagTransition(rid, ACTIVITY, (r.activity,), (IDLE,), cause))
        return out

    def plan_capabilities(self, resource_id: str, capabilities: frozenset[str], cause: str) -> list[Decision]:
        r = self.get(resource_id)
        if r.capabilities == capabilities:
            return []
        return [TagTransition(resource_id, CAPABILITY, sorted_tags(r.capabilities), sorted_tags(capabilities), cause)]

    def plan_activity(self, resource_id: str, activity: str, cause: str) -> list[Decision]:
        r = self.get(resource_id)
        if r.activity == activity:
            return []
        return [TagTransition(resource_id, ACTIVITY, (r.activity,), (activity,), cause)]

    def plan_loss(self, resource_id: str, cause: str) -> list[Decision]:
        """Take a resource out: it loses every tag, and the assignment it was part of is handed back."""
        r = self.get(resource_id)
        if not r.alive:
            return []
        out: list[Decision] = [ResourceLost(resource_id, cause, r.last_heartbeat)]
        if r.assignment_id is not None:
            a = self.assignments[r.assignment_id]
            out.append(Preemption(a.assignment_id, a.task_kind, a.resource_ids, cause, None, tuple(a.work)))
            for rid in a.resource_ids:
                other = self.resources[rid]
                if rid == resource_id or not other.alive:
                    continue
                if a.task_kind == ROLLOUT:
                    out.append(PauseRollout(rid, "abort", cause))
                if other.activity != IDLE:
                    out.append(TagTransition(rid, ACTIVITY, (other.activity,), (IDLE,), cause))
        if r.capabilities:
            out.append(TagTransition(resource_id, CAPABILITY, sorted_tags(r.capabilities), (), cause))
        out.append(TagTransition(resource_id, ACTIVITY, (r.activity,), (OFFLINE,), cause))
        return out

    # ---------------------------------------------------------------------------------- evolve

    def apply(self, record: Record) -> None:
        handler = _APPLY.get(type(record))
        if handler is not None:
            handler(self, record)

    def _bump(self) -> None:
        self.epoch += 1
        self.structure_epoch += 1

    def _apply_registered(self, obs: ResourceRegistered) -> None:
        self.structure_epoch += 1
        existing = self.resources.get(obs.resource_id)
        if existing is not None and existing.alive:
            # A re-registration of a live resource (engine restart we did not see fail): keep its
            # tags and work, just refresh what it reports.
            existing.device = obs.device
            existing.train_priority = train_priority(obs.device)
            existing.last_heartbeat = max(existing.last_heartbeat, obs.t)
            existing.weights_version = obs.loaded_version
            self.epoch += 1
            return
        seq = existing.registered_seq if existing is not None else self._registrations
        if existing is None:
            self._registrations += 1
        self.resources[obs.resource_id] = Resource(
            resource_id=obs.resource_id,
            device=obs.device,
            train_priority=train_priority(obs.device),
            registered_seq=seq,
            last_heartbeat=obs.t,
            weights_version=obs.loaded_version,
        )
        self.epoch += 1

    def _apply_heartbeat(self, obs: Heartbeat) -> None:
        r = self.resources.get(obs.resource_id)
        if r is not None and r.alive:
            r.last_heartbeat = max(r.last_heartbeat, obs.t)

    def _apply_tag(self, d: TagTransition) -> None:
        r = self.get(d.resource_id)
        was_serving = _is_serving(r)
        if d.tag_kind == CAPABILITY:
            if sorted_tags(r.capabilities) != d.from_tags:
                raise ReplayError(
                    f"capability transition of {d.resource_id!r} from {d.from_tags} but it has "
                    f"{sorted_tags(r.capabilities)}"
                )
            r.capabilities = frozenset(d.to_tags)
        elif d.tag_kind == ACTIVITY:
            if (r.activity,) != d.from_tags:
                raise ReplayError(
                    f"activity transition of {d.resource_id!r} from {d.from_tags} but it is {r.activity!r}"
                )
            if len(d.to_tags) != 1:
                raise ReplayError(f"a resource has exactly one activity tag, got {d.to_tags!r}")
            r.activity = d.to_tags[0]
        else:
            raise ReplayError(f"unknown tag kind {d.tag_kind!r}")
        self.serving_count += _is_serving(r) - was_serving
        self._bump()

    def _apply_lost(self, d: ResourceLost) -> None:
        r = self.get(d.resource_id)
        self.serving_count -= _is_serving(r)
        r.alive = False
        self._bump()

    def _apply_assignment(self, d: Assignment) -> None:
        if d.assignment_id in self.assignments:
            raise ReplayError(f"assignment {d.assignment_id!r} issued twice")
        for rid in d.resource_ids:
            r = self.get(rid)
            if r.assignment_id is not None:
                raise ReplayError(f"{rid!r} still holds {r.assignment_id!r} when {d.assignment_id!r} is issued")
            r.assignment_id = d.assignment_id
        self.assignments[d.assignment_id] = AssignmentState(
            d.assignment_id, d.task_kind, d.resource_ids, d.step, d.policy_version, list(d.work)
        )
        seq = _assignment_seq(d.assignment_id)
        if seq is not None:
            self.next_assignment_seq = max(self.next_assignment_seq, seq + 1)
        self.epoch += 1

    def _end_assignment(self, assignment_id: str) -> None:
        a = self.assignments.pop(assignment_id, None)
        if a is None:
            return
        for rid in a.resource_ids:
            r = self.resources[rid]
            if r.assignment_id == assignment_id:
                r.assignment_id = None
        self._bump()

    def _apply_preemption(self, d: Preemption) -> None:
        if d.assignment_id not in self.assignments:
            raise ReplayError(f"preemption of unknown assignment {d.assignment_id!r}")
        self._end_assignment(d.assignment_id)

    def _apply_train_data(self, d: TrainData) -> None:
        a = self.assignments.get(d.assignment_id)
        if a is None:
            raise ReplayError(f"train data for unknown assignment {d.assignment_id!r}")
        a.work.extend(d.group_ids)

    def _apply_step_completed(self, obs: TrainStepCompleted | TrainStepSkipped) -> None:
        self._end_assignment(obs.assignment_id)

    def _apply_weights_loaded(self, obs: WeightsLoaded) -> None:
        r = self.resources.get(obs.resource_id)
        if r is not None and r.alive:
            r.weights_version = obs.version
            self.epoch += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "resources": {rid: r.snapshot() for rid, r in self.resources.items()},
            "assignments": {aid: a.snapshot() for aid, a in self.assignments.items()},
            "next_assignment_seq": self.next_assignment_seq,
            "serving_count": self.serving_count,
        }


def _is_serving(r: Resource) -> int:
    return int(r.alive and ROLLOUT in r.capabilities and r.activity in (ROLLOUT, WEIGHT_SYNC))


def _assignment_seq(assignment_id: str) -> int | None:
    if assignment_id.startswith("a") and assignment_id[1:].isdigit():
        return int(assignment_id[1:])
    return None


_APPLY: dict[type, Any] = {
    ResourceRegistered: ResourcePool._apply_registered,
    Heartbeat: ResourcePool._apply_heartbeat,
    TagTransition: ResourcePool._apply_tag,
    ResourceLost: ResourcePool._apply_lost,
    Assignment: ResourcePool._apply_assignment,
    Preemption: ResourcePool._apply_preemption,
    TrainData: ResourcePool._apply_train_data,
    TrainStepCompleted: ResourcePool._apply_step_completed,
    TrainStepSkipped: ResourcePool._apply_step_completed,
    WeightsLoaded: ResourcePool._apply_weights_loaded,
}

"""Tag policies as data: which capability tags each resource gets, and the train/rollout rule.

A policy is an ordered list of tag groups plus three knobs; the scheduler has one code path for all
of them. Groups are filled in order from the alive resources ranked by the placement rule (by
`train_priority` on heterogeneous pools), so the first group, the one that carries `train`, lands on
the compute-rich devices. The switching rule is the same for every policy:

* every resource with the `rollout` tag rolls out while it is not training;
* when enough samples are ready, *all* alive `train`-tagged resources are assigned the SPMD train
  step; those that were rolling out are preempted (partial outputs migrate to the others);
* when the step ends, `train`-tagged resources that also carry `rollout` load the new weights and
  go back to rollout; the others wait idle for the next step.

`max_staleness` (eta) bounds the policy-version lag of every *trained token*: 0 = synchronous
on-policy, 1 = one-step asynchronous. Under partial rollout a sample that spans a weight sync holds
tokens of several versions, so what the bound constrains is a group's *oldest* token: generated at
version v, it must be trained by step v + eta. With `strict_staleness` (the default) the bound holds
for every trained token, stragglers included, and `straggler` says what happens to a group still
rolling out when the last step allowed to take its oldest tokens closes its batch:

* ``"wait"``: the step keeps its batch open until the group is done (a barrier on the long tail);
* ``"abort"``: the step closes on the groups that are complete and the straggler is aborted, its
  tokens discarded (waste); it is re-generated under the current version up to
  `max_regenerations` times, then dropped.

Without `strict_staleness` only the dispatch budget applies, i.e. AReaL's head-only bound, and a
straggler may be trained on later with older tokens than eta allows.
`train_microbatches` > 1 lets a train step start on the first micro-batch and stream the rest in
(DeepCoder-style). `adaptive` makes the train-capable resources' two bets cost-aware (see
`scheduler_svc.lending`): a partial batch starts training only when its stragglers will be done by
the time it is trained, and a resource free after a step is lent back to rollout only when the
window until the next step exceeds the round trip's cost; otherwise it stays ready for training.

Colocated, disaggregated and spatiotemporal multiplexing are just three tag layouts of this model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from scheduler_svc.errors import ConfigError
from scheduler_svc.tags import CAPABILITIES, CRITIC, REFERENCE, ROLLOUT, TRAIN


class Placement(StrEnum):
    """Which resources get a group's tags first."""

    TRAIN_PRIORITY = "train_priority"
    REGISTRATION_ORDER = "registration_order"


class StragglerRule(StrEnum):
    """What a strict staleness bound does with a group that would get too old (see the module doc)."""

    WAIT = "wait"
    ABORT = "abort"


PLACEMENTS = tuple(p.value for p in Placement)
STRAGGLER_RULES = tuple(r.value for r in StragglerRule)


class Placeable(Protocol):
    """What placement needs to know about a resource (the pool's Resource satisfies it)."""

    @property
    def resource_id(self) -> str: ...
    @property
    def train_priority(self) -> float: ...
    @property
    def registered_seq(self) -> int: ...
    @property
    def capabilities(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class TagGroup:
    """`count` resources (None: all remaining ones) get exactly `tags`."""

    tags: frozenset[str]
    count: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.tags) - CAPABILITIES
        if unknown:
            raise ConfigError(f"TagGroup.tags has unknown capability tags {sorted(unknown)!r}")
        if not self.tags:
            raise ConfigError("TagGroup.tags must not be empty")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"TagGroup.count must be >= 1 or None, got {self.count!r}")


@dataclass(frozen=True, slots=True)
class TagPolicy:
    name: str
    groups: tuple[TagGroup, ...]
    max_staleness: int = 0
    train_microbatches: int = 1
    placement: str = Placement.TRAIN_PRIORITY
    strict_staleness: bool = True
    straggler: str = StragglerRule.WAIT
    max_regenerations: int = 1
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError(f"TagPolicy {self.name!r}: groups must not be empty")
        if self.max_staleness < 0:
            raise ConfigError(f"TagPolicy.max_staleness must be >= 0, got {self.max_staleness!r}")
        if self.train_microbatches < 1:
            raise ConfigError(f"TagPolicy.train_microbatches must be >= 1, got {self.train_microbatches!r}")
        if self.straggler not in STRAGGLER_RULES:
            raise ConfigError(f"TagPolicy.straggler must be one of {STRAGGLER_RULES}, got {self.straggler!r}")
        object.__setattr__(self, "straggler", StragglerRule(self.straggler))  # frozen: normalise once
        if self.straggler == StragglerRule.ABORT and not self.strict_staleness:
            raise ConfigError("TagPolicy.straggler='abort' needs strict_staleness=True (there is no bound to enforce)")
        if self.max_regenerations < 0:
            raise ConfigError(f"TagPolicy.max_regenerations must be >= 0, got {self.max_regenerations!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"TagPolicy.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        object.__setattr__(self, "placement", Placement(self.placement))
        all_tags = set().union(*(g.tags for g in self.groups))
        for needed in (ROLLOUT, TRAIN):
            if needed not in all_tags:
                raise ConfigError(f"TagPolicy {self.name!r}: no group carries the {needed!r} tag")

    def place(self, resources: Iterable[Placeable]) -> dict[str, frozenset[str]]:
        """Desired capability tags of each given (alive) resource.

        Deterministic and sticky: among equally ranked resources the ones already holding a group's
        tags keep them, so a join or a loss moves as few tags as possible.
        """
        remaining = list(resources)
        desired: dict[str, frozenset[str]] = {}
        for group in self.groups:
            if not remaining:
                break
            if self.placement == Placement.TRAIN_PRIORITY:
                remaining.sort(key=lambda r: (-r.train_priority, r.capabilities != group.tags, r.registered_seq))
            else:
                remaining.sort(key=lambda r: (r.capabilities != group.tags, r.registered_seq))
            take = len(remaining) if group.count is None else min(group.count, len(remaining))
            for r in remaining[:take]:
                desired[r.resource_id] = group.tags
            remaining = remaining[take:]
        return desired

    def describe(self) -> Mapping[str, object]:
        return {
            "name": self.name,
            "groups": [(sorted(g.tags), g.count) for g in self.groups],
            "max_staleness": self.max_staleness,
            "train_microbatches": self.train_microbatches,
            "placement": self.placement,
            "strict_staleness": self.strict_staleness,
            "straggler": self.straggler,
            "max_regenerations": self.max_regenerations,
            "adaptive": self.adaptive,
        }


def _train_tags(with_critic: bool) -> frozenset[str]:
    return frozenset({TRAIN, REFERENCE, CRITIC} if with_critic else {TRAIN, REFERENCE})


def colocated(*, max_staleness: int = 0, with_critic: bool = False, straggler: str = StragglerRule.WAIT) -> TagPolicy:
    """verl-style: every resource carries every tag; rollout and train alternate on all of them."""
    tags = _train_tags(with_critic) | {ROLLOUT}
    return TagPolicy("colocated", (TagGroup(tags, None),), max_staleness=max_staleness, straggler=straggler)


def disaggregated(
    train_resources: int,
    *,
    max_staleness: int = 0,
    train_microbatches: int = 1,
    with_critic: bool = False,
    placement: str = Placement.TRAIN_PRIORITY,
    straggler: str = StragglerRule.WAIT,
) -> TagPolicy:
    """OpenRLHF-style: `train_resources` only train, the rest only roll out."""
    return TagPolicy(
        "disaggregated",
        (TagGroup(_train_tags(with_critic), train_resources), TagGroup(frozenset({ROLLOUT}), None)),
        max_staleness=max_staleness,
        train_microbatches=train_microbatches,
        placement=placement,
        straggler=straggler,
    )


def spatiotemporal(
    train_resources: int,
    *,
    max_staleness: int = 1,
    train_microbatches: int = 1,
    with_critic: bool = False,
    placement: str = Placement.TRAIN_PRIORITY,
    straggler: str = StragglerRule.WAIT,
    adaptive: bool = False,
) -> TagPolicy:
    """SeamlessFlow: `train_resources` carry {rollout, train}, the rest {rollout}; all roll out, the
    train-capable ones are preempted for each step and return to rollout after it (`adaptive`: only
    when that pays, see `scheduler_svc.lending`)."""
    return TagPolicy(
        "spatiotemporal",
        (
            TagGroup(_train_tags(with_critic) | {ROLLOUT}, train_resources),
            TagGroup(frozenset({ROLLOUT}), None),
        ),
        max_staleness=max_staleness,
        train_microbatches=train_microbatches,
        placement=placement,
        straggler=straggler,
        adaptive=adaptive,
    )

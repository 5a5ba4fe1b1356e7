"""Canonical text and deterministic ids: what makes a rebuilt journal byte-identical to the original.

Every id the scheduler derives is a uuid5 in one fixed namespace, so a decision event re-created
from the journal carries the id of its first copy (a duplicate is recognisable by it), and every
JSON the journal holds is written with sorted keys and no spaces, so equal values give equal text.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import Any

from scheduler_svc import decisions as core

#: uuid5 namespace of every id the scheduler derives (fixed forever: ids must survive upgrades).
NAMESPACE = uuid.UUID("5b1f0c52-3d7e-4f4e-9a57-0c6e2f3d8a11")
def decision_event_id(run_id: str, seq: int) -> str:
    """Id of the `seq`-th decision event of a run (the same for every copy of it)."""
    return uuid.uuid5(NAMESPACE, f"{run_id}/event/{seq}").hex


def journal_event_id(run_id: str, seq: int) -> str:
    return uuid.uuid5(NAMESPACE, f"{run_id}/observed/{seq}").hex


def _plain(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal values give equal text (and digests)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


#: fields added to an observation after journals were written: left out while at their default, so a
#: journal from before them replays byte-identically
LATER_FIELDS: dict[type, frozenset[str]] = {core.TrainStepCompleted: frozenset({"filtered", "added_group_ids"})}


def observation_json(observation: core.Observation) -> dict[str, Any]:
    later = LATER_FIELDS.get(type(observation), frozenset())
    fields = {f.name: getattr(observation, f.name) for f in dataclasses.fields(observation)
              if f.name not in later or getattr(observation, f.name) != f.default}
    return {"type": type(observation).__name__, **fields}


def ms(t: float) -> int:
    """Seconds (the core's clock) as event milliseconds."""
    return round(t * 1000)


def histogram(pairs: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    """((index, count), ...) as a dense tuple indexed by `index` (negative indexes dropped)."""
    counts = {i: n for i, n in pairs if i >= 0}
    return tuple(counts.get(i, 0) for i in range(max(counts, default=-1) + 1))

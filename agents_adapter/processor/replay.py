"""Replay of the trajectory processor: rebuild trajectories from their inputs, check them against the record.

`replay_trajectories(config, rng)` reads `llm.calls` and `sessions` over a range (bus.replay),
feeds them to a fresh `TrajectoryAssembler` with the processor's settings, and compares every
rebuilt Trajectory byte for byte (`encode_event`) with the copies recorded on `trajectories`.
`sflow replay trajectories --from … --to …` prints its `ReplayReport.render()` and can exit
non-zero when `not report.ok`. The config must carry the processor's settings (`producer`, `ttl_ms`,
`wait_for_calls`, … are part of the bytes): `ProcessorConfig.from_args([])` gives the defaults with
the bus from the environment; a plain BusConfig means those defaults too.

What is compared
    rebuilt: the sessions the inputs in the range close (SessionEnded, or the TTL: before each input
        the assembler expires sessions idle for `ttl_ms` at that input's log time, as the processor's
        timer does, and once more at the end of the range, less `grace_ms` for the timer's lag).
    recorded: the Trajectory events on `trajectories` from the range's start time on (a trajectory is
        written after its inputs, so no end bound), all copies of each trajectory id.
    scope: for an unbounded range every recorded trajectory must be explained by the inputs; for a
        bounded one only those of sessions with an input in the range (others belong to other ranges).
A range should hold whole sessions: a session cut by the range start is rebuilt from part of its
calls and shows as differing; one cut by the range end stays open and is not compared. TTL closes
depend on when the processor's timer ran relative to late calls: a call arriving within a tick of
its session's deadline can make a replay differ from the record (rare; shown, not hidden).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agents_adapter.errors import RejectedCallError
from agents_adapter.processor.assembler import TrajectoryAssembler
from agents_adapter.processor.config import ProcessorConfig
from bus.config import BusConfig
from bus.consumer import Received
from bus.replay import ReplayRange, replay
from schemas.events import (
    Event,
    LLMCall,
    SessionEnded,
    SessionStarted,
    Trajectory,
    TrajectoryNode,
    decode_event,
    encode_event,
    now_ms,
)

_SHOWN = 60


@dataclass(frozen=True)
class Difference:
    """A trajectory whose recorded copy is not the rebuilt one: the first field that differs."""

    trajectory_id: str
    field: str
    rebuilt: str
    recorded: str


@dataclass
class Rebuilt:
    """What the inputs of a range rebuild: closed trajectories, sessions left open, counts."""

    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    open_sessions: set[str] = field(default_factory=set)
    sessions_seen: set[str] = field(default_factory=set)
    inputs: int = 0
    rejected: int = 0
    ignored: int = 0


@dataclass
class ReplayReport:
    """Outcome of a trajectory replay; `ok` when every rebuilt trajectory was recorded identically
    and nothing in scope was recorded that the inputs do not explain."""

    range: ReplayRange
    inputs: int = 0
    undecodable: int = 0
    rejected_calls: int = 0
    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    differing: list[Difference] = field(default_factory=list)
    duplicates: int = 0
    open_sessions: list[str] = field(default_factory=list)
    recorded_but_open: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.differing)

    def render(self) -> str:
        def ids(items: list[str]) -> str:
            shown = ", ".join(items[:5])
            return shown + (f", … (+{len(items) - 5})" if len(items) > 5 else "")

        r = self.range
        bounds = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(r).items() if v is not None) or "whole log"
        lines = [
            f"trajectory replay over {bounds}: {self.inputs} input events"
            f" ({self.undecodable} undecodable, {self.rejected_calls} rejected calls)",
            f"  matched     {len(self.matched):>6}",
            f"  missing     {len(self.missing):>6}  {ids(self.missing)}",
            f"  extra       {len(self.extra):>6}  {ids(self.extra)}",
            f"  differing   {len(self.differing):>6}",
        ]
        lines += [f"    {d.trajectory_id}: {d.field}: rebuilt {d.rebuilt}, recorded {d.recorded}"
                  for d in self.differing[:10]]
        if len(self.differing) > 10:
            lines.append(f"    … (+{len(self.differing) - 10})")
        lines += [
            f"  duplicates  {self.duplicates:>6}  (extra identical copies: at-least-once redeliveries)",
            f"  open        {len(self.open_sessions):>6}  (sessions still open at the end of the range: not compared)",
        ]
        if self.recorded_but_open:
            lines.append(f"  recorded but open here {len(self.recorded_but_open)}: {ids(self.recorded_but_open)}"
                         " (the range ends before these sessions did)")
        lines.append("OK" if self.ok else "MISMATCH")
        return "\n".join(lines)


def rebuild_trajectories(inputs: Iterable[Received], config: ProcessorConfig, until_ms: int) -> Rebuilt:
    """Feeds inputs (in log order) to a fresh assembler with TTL sweeps at their log times (no Kafka)."""
    assembler = TrajectoryAssembler(config.assembler_config())
    out = Rebuilt()

    def closed(trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            out.trajectories[t.trajectory_id] = t

    for received in inputs:
        event = received.event
        closed(assembler.expire(received.timestamp_ms, config.ttl_ms).trajectories)
        if not isinstance(event, (LLMCall, SessionStarted, SessionEnded)):
            out.ignored += 1
            continue
        out.inputs += 1
        out.sessions_seen.add(event.session_id)
        try:
            closed(assembler.on_event(event).trajectories)
        except RejectedCallError:
            out.rejected += 1
    closed(assembler.expire(until_ms, config.ttl_ms).trajectories)
    out.open_sessions = {sid for sid in out.sessions_seen if assembler.tree(sid) is not None}
    return out


def replay_trajectories(
    config: ProcessorConfig | BusConfig,
    rng: ReplayRange | None = None,
    *,
    grace_ms: int | None = None,
    timeout_s: float = 10.0,
) -> ReplayReport:
    """Rebuilds the trajectories of a range and compares them with the recorded ones.

    config: the processor's settings (its `producer`, `ttl_ms`, … are part of the bytes); a plain
        BusConfig means the processor's defaults. grace_ms: how far before the range end (or now)
        the final TTL sweep stops, so sessions the processor's timer has not closed yet are not
        reported missing (default: two ticks + 1 s).
    """
    cfg = config if isinstance(config, ProcessorConfig) else ProcessorConfig(bus=config)
    rng = rng or ReplayRange()
    grace = grace_ms if grace_ms is not None else int(2_000 * cfg.tick_interval_s) + 1_000
    until = (rng.end_ms if rng.end_ms is not None else now_ms()) - grace
    inputs = replay(cfg.bus, ["llm.calls", "sessions"], rng, timeout_s=timeout_s)
    rebuilt = rebuild_trajectories(inputs.events, cfg, until)
    record = replay(cfg.bus, ["trajectories"], ReplayRange(start_ms=rng.start_ms), timeout_s=timeout_s)
    recorded: dict[str, list[bytes]] = defaultdict(list)
    for r in record.events:
        if isinstance(r.event, Trajectory):
            recorded[r.event.trajectory_id].append(r.raw)
    report = ReplayReport(range=rng, inputs=rebuilt.inputs, undecodable=len(inputs.skipped),
                          rejected_calls=rebuilt.rejected, open_sessions=sorted(rebuilt.open_sessions))
    for tid, trajectory in sorted(rebuilt.trajectories.items()):
        copies = recorded.get(tid)
        if not copies:
            report.missing.append(tid)
            continue
        expected = encode_event(trajectory)
        report.duplicates += max(0, sum(raw == expected for raw in copies) - 1)
        difference = _first_difference_of_copies(trajectory, copies)
        if difference is None:
            report.matched.append(tid)
        else:
            report.differing.append(difference)
    unbounded = rng == ReplayRange()
    for tid in sorted(recorded):
        if tid in rebuilt.trajectories:
            continue
        if tid in rebuilt.open_sessions:
            report.recorded_but_open.append(tid)
        elif unbounded or tid in rebuilt.sessions_seen:
            report.extra.append(tid)
    return report


def _first_difference_of_copies(rebuilt: Trajectory, copies: list[bytes]) -> Difference | None:
    expected = encode_event(rebuilt)
    for raw in dict.fromkeys(copies):
        if raw == expected:
            continue
        recorded = decode_event(raw)
        where = first_difference(rebuilt, recorded)
        if where is not None:
            return Difference(rebuilt.trajectory_id, *where)
        if encode_event(recorded) != expected:  # equal fields, other bytes: cannot happen for one schema
            return Difference(rebuilt.trajectory_id, "<encoding>", f"{len(expected)} bytes", f"{len(raw)} bytes")
    return None


def first_difference(a: Event, b: Event) -> tuple[str, str, str] | None:
    """(field path, value in a, value in b) of the first field where two events differ, else None."""
    if type(a) is not type(b):
        return "event_type", a.event_type, b.event_type
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "nodes":
            where = _first_node_difference(x, y)
            if where is not None:
                return where
        elif not _same(x, y):
            return f.name, _short(x), _short(y)
    return None


def _first_node_difference(a: tuple[TrajectoryNode, ...], b: tuple[TrajectoryNode, ...]) -> tuple[str, str, str] | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for f in dataclasses.fields(x):
            if not _same(getattr(x, f.name), getattr(y, f.name)):
                return f"nodes[{i}].{f.name}", _short(getattr(x, f.name)), _short(getattr(y, f.name))
    if len(a) != len(b):
        return "nodes", f"{len(a)} nodes", f"{len(b)} nodes"
    return None


def _same(x: object, y: object) -> bool:
    if isinstance(x, (tuple, list)) or hasattr(x, "tolist"):
        return list(x) == list(y)  # type: ignore[call-overload]
    return x == y


def _short(value: object) -> str:
    text = repr(list(value) if hasattr(value, "tolist") else value)  # type: ignore[call-overload]
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"

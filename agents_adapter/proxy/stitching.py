"""Stitching one LLM call from several engine runs (partial rollout, docs/architecture.md).

An engine that is preempted answers finish_reason `abort` with what it generated so far; an engine
that dies answers nothing. Either way the call goes on elsewhere: the next run's prompt is the
call's prompt + everything generated so far, and its budget is max_new_tokens minus that. The agent
gets one response; the record keeps every run as a `Segment` (resource, weight version, where its
tokens start, how many, why it ended, when) and every token's logprob and policy version.

Nothing here does I/O: `dispatch.Dispatcher` runs the engines and feeds their answers in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from agents_adapter.errors import EngineFailedError
from schemas.events import Segment

FINISHED = frozenset({"stop", "length"})


@dataclass(frozen=True)
class EngineRun:
    """What one engine request returned (finish: stop, length or abort)."""

    output_ids: Sequence[int]
    logprobs: Sequence[float]
    versions: Sequence[int]
    finish: str
    weight_version: int


@dataclass
class StitchedCall:
    """The output of one call, accumulated over its engine runs."""

    prompt_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    finish_reason: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason in FINISHED

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    def next_input_ids(self) -> list[int]:
        """Prompt of the next run: the call's prompt and every token generated so far."""
        return self.prompt_ids + self.output_ids

    def add(self, resource_id: str, run: EngineRun, started_ms: int, ended_ms: int) -> None:
        """Appends a run's tokens; raises `EngineFailedError` if the engine broke the protocol."""
        n = len(run.output_ids)
        if len(run.logprobs) != n or len(run.versions) != n:
            raise EngineFailedError(
                f"engine {resource_id} returned {n} tokens with {len(run.logprobs)} logprobs and "
                f"{len(run.versions)} versions"
            )
        if n > self.remaining:
            raise EngineFailedError(f"engine {resource_id} returned {n} tokens for a budget of {self.remaining}")
        if run.finish not in (*FINISHED, "abort"):
            raise EngineFailedError(f"engine {resource_id} returned finish_reason {run.finish!r}")
        version = int(run.versions[0]) if n else run.weight_version
        self.segments.append(Segment(
            resource_id=resource_id, weight_version=version, start=len(self.output_ids), num_tokens=n,
            finish_reason=run.finish, started_ms=started_ms, ended_ms=ended_ms,
        ))
        self.output_ids.extend(int(t) for t in run.output_ids)
        self.logprobs.extend(float(lp) for lp in run.logprobs)
        self.versions.extend(int(v) for v in run.versions)
        if run.finish in FINISHED:
            self.finish_reason = run.finish
        elif self.remaining <= 0:  # preempted right at the budget: nothing left to resume
            self.finish_reason = "length"
        else:
            self.finish_reason = "abort"

    def add_failure(self, resource_id: str, weight_version: int, started_ms: int, ended_ms: int) -> None:
        """A run that produced nothing we received (connection refused or engine died mid-call)."""
        self.segments.append(Segment(
            resource_id=resource_id, weight_version=weight_version, start=len(self.output_ids), num_tokens=0,
            finish_reason="error", started_ms=started_ms, ended_ms=ended_ms,
        ))

    def truncate(self, length: int) -> None:
        """Keeps the first `length` output tokens (a stop string ended the reply there): finish is stop.

        Segments keep their engine finish reasons; those starting past `length` are dropped and the one
        holding the cut is shortened, so segment token counts still add up to the output.
        """
        if not 0 <= length <= len(self.output_ids):
            raise ValueError(f"truncate({length}) outside the output of {len(self.output_ids)} tokens")
        del self.output_ids[length:], self.logprobs[length:], self.versions[length:]
        kept = [
            dataclasses.replace(s, num_tokens=min(s.num_tokens, length - s.start))
            for s in self.segments
            if s.start < length or (s.num_tokens == 0 and s.start <= length)
        ]
        self.segments = kept or [dataclasses.replace(self.segments[0], num_tokens=0)]
        self.finish_reason = "stop"

    @property
    def resumed(self) -> int:
        """Runs after the first (0 for an ordinary call)."""
        return max(0, len(self.segments) - 1)

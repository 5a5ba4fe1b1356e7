"""Admission and batching of the native engine: request records, the command inbox, slot bookkeeping.

The engine's loop thread (`engine.NativeEngine`) owns every structure here; other threads reach them
only through the `Inbox` (a request to queue, or a command to run at the next token boundary).

A request is validated when it is submitted (`validate_request`), so a bad one is refused at once and
never reaches the loop. Sampling is seeded per request (`sampling_seed`, else derived from the engine
seed and arrival order), each request drawing from its own `torch.Generator`, so its tokens do not
depend on its batch-mates. `Batch` admits waiting requests into free slots (slot i holds running[i],
kept contiguous as requests leave), packs prefills under `max_prefill_tokens`, and resolves futures.
"""

from __future__ import annotations

import math
import queue
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from inference_svc.grammar import advance
from inference_svc.model_runner import SlotKVCache
from inference_svc.prefix_cache import PrefixCache
from inference_svc.sampling import GREEDY_TEMPERATURE_FLOOR, RowSampling
from schemas.inference.errors import InvalidRequestError
from schemas.inference.types import (
    ABORT_BEFORE_PREFILL,
    DEFAULT_MAX_NEW_TOKENS,
    FinishReason,
    GenerationResult,
    SamplingOptions,
)


@dataclass(eq=False)
class RequestState:
    """One request from submission to its result: prompt, what it generated, where its KV is."""

    rid: str
    prompt: list[int]
    sampling: RowSampling
    max_new_tokens: int
    stop_ids: frozenset[int]
    generator: torch.Generator
    future: Future[GenerationResult]
    listener: Callable[[GenerationResult], object] | None
    started: float = field(default_factory=time.perf_counter)
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cached_len: int = 0  # tokens whose KV is in the slot; the rest are fed at the next step
    slot: int = -1
    reused: int = 0  # prompt tokens taken from the prefix cache
    matcher: Any = None  # the grammar's llguidance matcher of a constrained request (`grammar`), else None

    def accept(self, token: int, logprob: float, version: int, max_context: int,
               eos_ids: frozenset[int]) -> FinishReason | None:
        """Appends a sampled token (its grammar's matcher advanced); why the request ends with it, if it does."""
        self.cached_len = len(self.prompt) + len(self.out_ids)
        self.out_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        grammar_done = self.matcher is not None and advance(self.matcher, token) and token in eos_ids
        if token in self.stop_ids or grammar_done:
            return FinishReason("stop", matched=token)
        if len(self.out_ids) >= self.max_new_tokens or len(self.prompt) + len(self.out_ids) >= max_context:
            return FinishReason("length", length=len(self.out_ids))
        return None

    def uncached_tokens(self) -> list[int]:
        """The tokens to feed at the next step (without rebuilding prompt + output every step)."""
        if self.cached_len >= len(self.prompt):
            return self.out_ids[self.cached_len - len(self.prompt) :]
        return self.prompt[self.cached_len :] + self.out_ids

    def pending(self) -> int:
        return len(self.prompt) + len(self.out_ids) - self.cached_len

    def result(self, finish: FinishReason | None, version: int) -> GenerationResult:
        return GenerationResult(
            rid=self.rid,
            prompt_ids=list(self.prompt),
            output_ids=list(self.out_ids),
            output_logprobs=list(self.logprobs),
            output_versions=list(self.versions),
            finish_reason=finish,
            weight_version=version,
            e2e_latency_s=time.perf_counter() - self.started,
            cached_tokens=self.reused,
        )


def validate_request(input_ids: list[int], sampling: SamplingOptions, vocab_size: int, max_context: int) -> int:
    """Checks a request against the served model and returns its resolved max_new_tokens."""
    if not input_ids:
        raise InvalidRequestError("input_ids is empty: give at least one prompt token")
    for i, tok in enumerate(input_ids):
        if not 0 <= tok < vocab_size:
            raise InvalidRequestError(f"input_ids[{i}]={tok} is outside the vocabulary [0, {vocab_size})")
    room = max_context - len(input_ids)
    if room <= 0:
        raise InvalidRequestError(f"the prompt has {len(input_ids)} tokens; the context length is {max_context}")
    if sampling.max_new_tokens is not None and sampling.max_new_tokens > room:
        raise InvalidRequestError(
            f"len(input_ids)={len(input_ids)} + max_new_tokens={sampling.max_new_tokens} exceeds the "
            f"context length {max_context}"
        )
    if sampling.max_new_tokens is not None and sampling.max_new_tokens < 0:
        raise InvalidRequestError(f"max_new_tokens={sampling.max_new_tokens} must be >= 0")
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidRequestError(f"temperature={sampling.temperature} must be a finite number >= 0")
    if not 0.0 < sampling.top_p <= 1.0:
        raise InvalidRequestError(f"top_p={sampling.top_p} must be in (0, 1]")
    if sampling.top_k == 0 or sampling.top_k < -1:
        raise InvalidRequestError(f"top_k={sampling.top_k} must be -1 (whole vocabulary) or >= 1")
    for tok in sampling.stop_token_ids:
        if not 0 <= tok < vocab_size:
            raise InvalidRequestError(f"stop_token_ids has {tok}, outside [0, {vocab_size})")
    if sampling.structural_tag is not None:
        raise InvalidRequestError("structural_tag is not served by the native engine: send the grammar as ebnf "
                                  "(Lark), json_schema or regex")
    if sampling.max_new_tokens is None:
        return min(DEFAULT_MAX_NEW_TOKENS, room)
    return sampling.max_new_tokens


def new_request(
    rid: str, input_ids: list[int], sampling: SamplingOptions, max_new_tokens: int, *, seed: int,
    eos_ids: frozenset[int], listener: Callable[[GenerationResult], object] | None, matcher: Any = None,
) -> RequestState:
    """The record of a validated request; its future is already running (it cannot be cancelled)."""
    stop_ids = set(sampling.stop_token_ids)
    if not sampling.ignore_eos:
        stop_ids |= eos_ids
    temperature = sampling.temperature
    seq = RequestState(
        rid=rid,
        prompt=list(input_ids),
        sampling=RowSampling(
            temperature=temperature,
            top_p=sampling.top_p,
            top_k=1 if temperature < GREEDY_TEMPERATURE_FLOOR else sampling.top_k,
        ),
        max_new_tokens=max_new_tokens,
        stop_ids=frozenset(stop_ids),
        generator=torch.Generator().manual_seed(seed % (2**63)),
        future=Future(),
        listener=listener,
        matcher=matcher,
    )
    seq.future.set_running_or_notify_cancel()
    return seq


def abort_reason(seq: RequestState, message: str) -> FinishReason:
    return FinishReason("abort", message=message if seq.out_ids else ABORT_BEFORE_PREFILL)


@dataclass
class Command:
    """A control call to run on the loop thread; its future carries the return value or the error."""

    run: Callable[[], Any]
    future: Future[Any]


class Inbox:
    """What other threads hand the loop thread: requests to queue, commands, and None to stop."""

    def __init__(self) -> None:
        self._queue: queue.Queue[RequestState | Command | None] = queue.Queue()

    def put(self, item: RequestState | Command | None) -> None:
        self._queue.put(item)

    def drain(self, block: bool, queue_request: Callable[[RequestState], None]) -> bool:
        """Runs the commands that arrived and queues the requests; False once a stop was asked for."""
        try:
            item = self._queue.get(block=block)
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            if isinstance(item, Command):
                try:
                    item.future.set_result(item.run())
                except Exception as e:
                    item.future.set_exception(e)
            else:
                queue_request(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True

    def fail_all(self, error: Exception) -> None:
        """Fails everything still queued (the loop is gone, nothing will run it)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item.future.set_exception(error)


class Batch:
    """The running and waiting requests of one engine; only the loop thread touches it."""

    def __init__(self, cache: SlotKVCache, prefixes: PrefixCache, max_running: int, max_prefill_tokens: int) -> None:
        self.cache = cache
        self.prefixes = prefixes
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.running: list[RequestState] = []  # invariant: self.running[i].slot == i
        self.waiting: deque[RequestState] = deque()
        self.requests_finished = 0

    def __bool__(self) -> bool:
        return bool(self.running or self.waiting)

    def all(self) -> list[RequestState]:
        return [*self.running, *self.waiting]

    def admit(self, version: int) -> None:
        """Moves waiting requests into free slots, each starting from the longest cached prefix of its prompt."""
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            if seq.max_new_tokens == 0:
                self.resolve(seq, FinishReason("length", length=0), version)
                continue
            seq.slot = len(self.running)
            seq.cached_len = 0
            if not seq.out_ids:
                seq.cached_len = seq.reused = self.prefixes.restore(seq.prompt, seq.slot)
            self.running.append(seq)

    def prefill_groups(self, seqs: list[RequestState]) -> list[list[RequestState]]:
        """Packs prefills so that rows x padded width stays under max_prefill_tokens per forward."""
        groups: list[list[RequestState]] = []
        current: list[RequestState] = []
        for seq in sorted(seqs, key=lambda s: s.pending()):
            if current and (len(current) + 1) * seq.pending() > self.max_prefill_tokens:
                groups.append(current)
                current = []
            current.append(seq)
        if current:
            groups.append(current)
        return groups

    def drop_kv(self) -> None:
        """Running requests re-prefill prompt + generated at the next step (retract, new weights)."""
        for seq in self.running:
            seq.cached_len = 0

    def resolve(self, seq: RequestState, finish: FinishReason, version: int) -> None:
        self.requests_finished += 1
        seq.future.set_result(seq.result(finish, version))

    def finish(self, seq: RequestState, finish: FinishReason, version: int) -> None:
        """Resolves a request outside a step and frees its slot at once."""
        self.resolve(seq, finish, version)
        if seq in self.waiting:
            self.waiting.remove(seq)
        else:
            self.release(seq)

    def release_finished(self) -> None:
        """Frees the slots of the requests the last step finished (highest slot first, so moves stay valid)."""
        for seq in sorted((s for s in self.running if s.future.done()), key=lambda s: -s.slot):
            self.release(seq)

    def release(self, seq: RequestState) -> None:
        """Removes a running sequence, moving the last one into its slot to keep the batch contiguous."""
        self.prefixes.keep(seq)
        last = self.running[-1]
        if last is not seq:
            self.cache.copy_slot(last.slot, seq.slot, last.cached_len)
            last.slot = seq.slot
            self.running[seq.slot] = last
        self.running.pop()
        seq.slot = -1

    def abort_all(self, message: str, version: int) -> int:
        """Finishes every request with its partial output; the running ones' KV may serve later prompts."""
        victims = self.all()
        for seq in self.running:
            self.prefixes.keep(seq)
        for seq in victims:
            self.resolve(seq, abort_reason(seq, message), version)
        self.running.clear()
        self.waiting.clear()
        return len(victims)

    def fail_running(self, error: Exception) -> None:
        """A step failed: only the batch in flight fails, the engine goes on with the waiting requests."""
        failed, self.running = self.running, []
        for seq in failed:
            seq.slot = -1
            if not seq.future.done():
                seq.future.set_exception(error)

    def fail_all(self, error: Exception) -> None:
        for seq in self.all():
            if not seq.future.done():
                seq.future.set_exception(error)
        self.running.clear()
        self.waiting.clear()

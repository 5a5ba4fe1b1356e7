"""The native inference engine: continuous batching on torch + transformers, with partial rollout.

One background thread owns the model, the KV cache and every running sequence. Each loop iteration
first runs the control commands that arrived (new requests, pause, resume, abort, weight swap), then
takes one step: admit waiting requests into free slots, prefill those that need it, and decode one
token for every other running sequence in a single batched forward. Control therefore always acts at a
token boundary, and requests join and leave the batch between steps.

Partial rollout (docs/architecture.md, "Partial rollout"):
- `pause("in_place")` stops stepping and keeps every request and its KV cache; `resume()` goes on.
- `pause("retract")` also drops the KV cache; requests re-prefill prompt + generated on resume.
- `pause("abort")` finishes every request with finish_reason abort and its partial output (tokens,
  logprobs, versions); a caller resubmits `input_ids + output_ids` elsewhere to finish it.
- `update_weights_from_disk` reads and validates the checkpoint off the loop, then swaps it in at a
  boundary; running requests continue from their generated tokens by re-prefilling prompt + generated
  with the new weights, and every later token carries the new version. A bad checkpoint raises
  `WeightLoadError` and leaves the old weights live. Only checkpoints inside `weights_roots` load
  (`weights.resolve_inside`), and a given sha256 is checked over the very bytes that are swapped in.
- While paused, new requests queue (they are not refused) and start on resume.

Prefix reuse (optional, `prefix_cache_slots` > 0): the KV of finished requests is kept in spare slots;
a new request whose prompt starts with such a sequence (an agent's next turn extends its previous call)
copies that KV and prefills only the rest. `meta_info.cached_tokens` reports the reused length. A weight
swap, a retract or `flush_cache` drops these entries (their KV belongs to the old weights).

Sampling is seeded per request (`sampling_seed`, else derived from the engine seed and arrival order),
each request drawing from its own `torch.Generator`, so its tokens do not depend on its batch-mates.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from inference_svc.config import InferenceConfig
from inference_svc.model_runner import BatchRunner, SlotKVCache, model_shape
from inference_svc.sampling import GREEDY_TEMPERATURE_FLOOR, RowSampling, sample_rows
from inference_svc.weights import apply_state, read_checkpoint, resolve_inside
from schemas.inference.errors import EngineClosedError, InferenceError, InvalidRequestError, WeightLoadError
from schemas.inference.types import (
    ABORT_BEFORE_PREFILL,
    DEFAULT_MAX_NEW_TOKENS,
    MAX_WEIGHT_VERSION,
    PAUSE_MODES,
    EngineStats,
    FinishReason,
    GenerationResult,
    SamplingOptions,
    WeightUpdateResult,
)

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_T = TypeVar("_T")


@dataclass(eq=False)
class _Sequence:
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


@dataclass
class _Command:
    run: Callable[[], Any]
    future: Future[Any]


class NativeEngine:
    """Continuous-batching engine over a local Hugging Face model directory (see the module doc)."""

    def __init__(
        self,
        model_path: Path | str,
        *,
        max_running_requests: int = 64,
        max_context: int = 4096,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        weight_version: int = 0,
        kv_initial_tokens: int = 256,
        max_prefill_tokens: int = 8192,
        prefix_cache_slots: int = 0,
        num_threads: int | None = None,
        resource_id: str = "rollout-0",
        weights_roots: tuple[Path, ...] | None = None,
    ) -> None:
        """`weights_roots`: the directories hot swaps may read from (None: any path, for library use;
        the service always passes its configured roots, see `from_config`)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_path = Path(model_path)
        self.weights_roots = weights_roots
        self.resource_id = resource_id
        self._model: Any = _load_model(self.model_path, device, dtype)
        shape = model_shape(self._model)
        self.vocab_size = shape.vocab_size
        self.max_context = min(max_context, shape.max_positions)
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = _eos_ids(self._model)
        self.model_type: str = self._model.config.model_type
        self.architectures: list[str] = list(getattr(self._model.config, "architectures", None) or [])
        cache = SlotKVCache(
            shape, max_running_requests + prefix_cache_slots, min(kv_initial_tokens, self.max_context),
            self.max_context, _DTYPES[dtype], torch.device(device),
        )
        self._prefixes = _PrefixCache(cache, first_slot=max_running_requests, num_slots=prefix_cache_slots)
        self._runner = BatchRunner(self._model, cache)
        self._seed = seed
        self._arrivals = itertools.count(1)
        self._version = weight_version
        self._paused = False
        self._closed = False
        self._running: list[_Sequence] = []  # invariant: self._running[i].slot == i
        self._waiting: deque[_Sequence] = deque()
        self._inbox: queue.Queue[_Sequence | _Command | None] = queue.Queue()
        self._tokens_generated = 0
        self._requests_finished = 0
        self._thread = threading.Thread(target=self._loop, name=f"engine-{resource_id}", daemon=True)
        self._started = False

    @classmethod
    def from_config(cls, config: InferenceConfig) -> NativeEngine:
        return cls(
            config.model_path,
            max_running_requests=config.max_running_requests,
            max_context=config.max_context,
            device=config.device,
            dtype=config.dtype,
            seed=config.seed,
            weight_version=config.weight_version,
            kv_initial_tokens=config.kv_initial_tokens,
            prefix_cache_slots=config.prefix_cache_slots,
            num_threads=config.num_threads,
            resource_id=config.resource_id,
            weights_roots=config.weights_roots,
        )

    # ----- lifecycle ---------------------------------------------------------------------------

    def start(self) -> NativeEngine:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stops the loop; unfinished requests fail with `EngineClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        if self._started:
            self._thread.join(timeout_s)
        else:
            self._fail_leftovers()

    def __enter__(self) -> NativeEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def model(self) -> Any:
        """The live model (tests compare against a fresh forward of it)."""
        return self._model

    # ----- requests ----------------------------------------------------------------------------

    def validate(self, input_ids: list[int], sampling: SamplingOptions) -> int:
        """Checks a request against this model and returns its resolved max_new_tokens."""
        if not input_ids:
            raise InvalidRequestError("input_ids is empty: give at least one prompt token")
        for i, tok in enumerate(input_ids):
            if not 0 <= tok < self.vocab_size:
                raise InvalidRequestError(
                    f"input_ids[{i}]={tok} is outside the vocabulary [0, {self.vocab_size})"
                )
        room = self.max_context - len(input_ids)
        if room <= 0:
            raise InvalidRequestError(
                f"the prompt has {len(input_ids)} tokens; the context length is {self.max_context}"
            )
        if sampling.max_new_tokens is not None and sampling.max_new_tokens > room:
            raise InvalidRequestError(
                f"len(input_ids)={len(input_ids)} + max_new_tokens={sampling.max_new_tokens} exceeds the "
                f"context length {self.max_context}"
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
            if not 0 <= tok < self.vocab_size:
                raise InvalidRequestError(f"stop_token_ids has {tok}, outside [0, {self.vocab_size})")
        if sampling.max_new_tokens is None:
            return min(DEFAULT_MAX_NEW_TOKENS, room)
        return sampling.max_new_tokens

    def submit(
        self,
        input_ids: list[int],
        sampling: SamplingOptions | None = None,
        *,
        rid: str | None = None,
        listener: Callable[[GenerationResult], object] | None = None,
    ) -> Future[GenerationResult]:
        """Queues a request; the future resolves when it finishes (stop, length or abort).

        Raises `InvalidRequestError` at once for a request the engine could never serve. `listener`, if
        given, is called on the engine thread with a snapshot after every generated token (streaming).
        """
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        sampling = sampling or SamplingOptions()
        max_new = self.validate(input_ids, sampling)
        arrival = next(self._arrivals)
        seed = sampling.seed if sampling.seed is not None else (self._seed * 1_000_003 + arrival)
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids |= self.eos_token_ids
        temperature = sampling.temperature
        seq = _Sequence(
            rid=rid or uuid.uuid4().hex,
            prompt=list(input_ids),
            sampling=RowSampling(
                temperature=temperature,
                top_p=sampling.top_p,
                top_k=1 if temperature < GREEDY_TEMPERATURE_FLOOR else sampling.top_k,
            ),
            max_new_tokens=max_new,
            stop_ids=frozenset(stop_ids),
            generator=torch.Generator().manual_seed(seed % (2**63)),
            future=Future(),
            listener=listener,
        )
        seq.future.set_running_or_notify_cancel()
        self._inbox.put(seq)
        if self._closed and not self._thread.is_alive():  # the loop died meanwhile: do not leave it hanging
            self._fail_leftovers()
        return seq.future

    def generate(
        self, input_ids: list[int], sampling: SamplingOptions | None = None, *, rid: str | None = None,
        timeout_s: float | None = None,
    ) -> GenerationResult:
        """Blocking `submit`."""
        return self.submit(input_ids, sampling, rid=rid).result(timeout_s)

    # ----- control (each runs on the loop thread, i.e. at a token boundary) ----------------------

    def pause(self, mode: str = "in_place") -> int:
        """Stops generating at the next token boundary; returns how many requests were held or aborted."""
        if mode not in PAUSE_MODES:
            raise InvalidRequestError(f"mode={mode!r}: expected one of {', '.join(PAUSE_MODES)}")

        def run() -> int:
            self._paused = True
            affected = len(self._running) + len(self._waiting)
            if mode == "abort":
                self._abort_all_now("Aborted by pause_generation(mode=abort)")
            elif mode == "retract":
                self._prefixes.clear()
                for seq in self._running:
                    seq.cached_len = 0
            logger.info("paused", extra={"resource": self.resource_id, "mode": mode, "requests": affected})
            return affected

        return self._call(run)

    def resume(self) -> None:
        def run() -> None:
            self._paused = False

        self._call(run)

    def abort(self, rid: str) -> bool:
        """Finishes one request with finish_reason abort and its partial output; False if unknown."""

        def run() -> bool:
            for seq in [*self._running, *self._waiting]:
                if seq.rid == rid:
                    self._finish(seq, _abort_reason(seq, "Aborted by abort_request"))
                    return True
            return False

        return self._call(run)

    def abort_all(self) -> int:
        return self._call(lambda: self._abort_all_now("Aborted by abort_request(abort_all=True)"))

    def update_weights_from_disk(
        self,
        model_path: Path | str,
        weight_version: int | None = None,
        *,
        abort_all_requests: bool = False,
        sha256: str | None = None,
    ) -> WeightUpdateResult:
        """Hot-swaps weights from a safetensors checkpoint (see the module doc for the semantics).

        `sha256` (hex), if given, must be the digest of the checkpoint's bytes (`weights.checkpoint_sha256`
        defines it); otherwise the load fails and the old weights stay live.
        """
        if weight_version is not None and not 0 <= weight_version <= MAX_WEIGHT_VERSION:
            raise InvalidRequestError(f"weight_version={weight_version} must be in [0, 2**63)")
        started = time.perf_counter()
        path = Path(model_path) if self.weights_roots is None else resolve_inside(model_path, self.weights_roots)
        state = read_checkpoint(path, self._model, sha256=sha256, roots=self.weights_roots)
        load_ms = (time.perf_counter() - started) * 1000

        def run() -> tuple[int, float, int]:
            applying = time.perf_counter()
            if abort_all_requests:
                self._abort_all_now("Aborted by update_weights_from_disk(abort_all_requests=True)")
            apply_state(self._model, state)
            self._runner.refresh()
            self._prefixes.clear()
            self._version = self._version + 1 if weight_version is None else weight_version
            for seq in self._running:
                seq.cached_len = 0  # re-prefill prompt + generated with the new weights
            held = len(self._running) + len(self._waiting) if self._paused else 0
            return self._version, (time.perf_counter() - applying) * 1000, held

        version, apply_ms, held = self._call(run)
        logger.info(
            "weights swapped",
            extra={"resource": self.resource_id, "version": version, "load_ms": load_ms, "apply_ms": apply_ms},
        )
        return WeightUpdateResult(True, "Succeeded to update model weights.", version, load_ms, apply_ms, held)

    def flush_cache(self) -> bool:
        """Drops the prefix cache (running requests keep their own KV); always succeeds."""

        def run() -> bool:
            self._prefixes.clear()
            return True

        return self._call(run)

    def snapshot(self) -> list[GenerationResult]:
        """Partial results of every running and queued request, taken at a token boundary."""
        return self._call(lambda: [s.result(None, self._version) for s in [*self._running, *self._waiting]])

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            queued=len(self._waiting),
            paused=self._paused,
            weight_version=self._version,
            tokens_generated=self._tokens_generated,
            requests_finished=self._requests_finished,
        )

    # ----- loop --------------------------------------------------------------------------------

    def _call(self, run: Callable[[], _T]) -> _T:
        if threading.current_thread() is self._thread:
            return run()
        if self._closed or (self._started and not self._thread.is_alive()):
            raise EngineClosedError("the engine is shut down")
        future: Future[_T] = Future()
        self._inbox.put(_Command(run, future))
        if not self._started:
            self.start()
        return future.result()

    def _loop(self) -> None:
        # Everything that touches the model or the KV cache runs on this thread, in inference mode:
        # tensors created here (a grown cache) are inference tensors and may only be updated here.
        try:
            with torch.inference_mode():
                self._serve()
        finally:
            self._closed = True
            self._fail_leftovers()

    def _serve(self) -> None:
        while True:
            idle = self._paused or not (self._running or self._waiting)
            if not self._drain_inbox(block=idle):
                return
            if self._paused or not (self._running or self._waiting):
                continue
            try:
                self._step()
            except Exception as e:  # the engine keeps serving: only the batch in flight fails
                logger.exception("engine step failed", extra={"resource": self.resource_id})
                failed, self._running = self._running, []
                for seq in failed:
                    seq.slot = -1
                    if not seq.future.done():
                        seq.future.set_exception(InferenceError(f"engine step failed: {e}"))

    def _drain_inbox(self, block: bool) -> bool:
        """Runs what arrived; False once shutdown was requested."""
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            if isinstance(item, _Command):
                try:
                    item.future.set_result(item.run())
                except Exception as e:
                    item.future.set_exception(e)
            else:
                self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _fail_leftovers(self) -> None:
        closed = EngineClosedError("the engine was shut down")
        for seq in [*self._running, *self._waiting]:
            if not seq.future.done():
                seq.future.set_exception(closed)
        self._running.clear()
        self._waiting.clear()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Sequence | _Command):
                item.future.set_exception(closed)

    def _step(self) -> None:
        self._admit()
        prefill = [s for s in self._running if s.pending() > 1]
        decode = [s for s in self._running if s.pending() == 1]
        for group in self._prefill_groups(prefill):
            self._extend_and_sample(group)
        if decode:
            self._extend_and_sample(decode)
        for seq in sorted((s for s in self._running if s.future.done()), key=lambda s: -s.slot):
            self._release(seq)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_running_requests:
            seq = self._waiting.popleft()
            if seq.max_new_tokens == 0:
                self._resolve(seq, FinishReason("length", length=0))
                continue
            seq.slot = len(self._running)
            seq.cached_len = 0
            if not seq.out_ids:
                seq.cached_len = seq.reused = self._prefixes.restore(seq.prompt, seq.slot)
            self._running.append(seq)

    def _prefill_groups(self, seqs: list[_Sequence]) -> list[list[_Sequence]]:
        """Packs prefills so that rows x padded width stays under max_prefill_tokens per forward."""
        groups: list[list[_Sequence]] = []
        current: list[_Sequence] = []
        for seq in sorted(seqs, key=lambda s: s.pending()):
            if current and (len(current) + 1) * seq.pending() > self.max_prefill_tokens:
                groups.append(current)
                current = []
            current.append(seq)
        if current:
            groups.append(current)
        return groups

    def _extend_and_sample(self, group: list[_Sequence]) -> None:
        logits = self._runner.extend(
            [s.slot for s in group], [s.cached_len for s in group], [s.uncached_tokens() for s in group]
        )
        uniforms = torch.cat([torch.rand(1, generator=s.generator) for s in group])
        tokens, logprobs = sample_rows(logits, [s.sampling for s in group], uniforms)
        version = self._version
        for seq, tok, lp in zip(group, tokens.tolist(), logprobs.tolist(), strict=True):
            seq.cached_len = len(seq.prompt) + len(seq.out_ids)
            seq.out_ids.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(version)
            self._tokens_generated += 1
            if tok in seq.stop_ids:
                self._resolve(seq, FinishReason("stop", matched=tok))
            elif len(seq.out_ids) >= seq.max_new_tokens or len(seq.prompt) + len(seq.out_ids) >= self.max_context:
                self._resolve(seq, FinishReason("length", length=len(seq.out_ids)))
            elif seq.listener is not None:
                self._notify(seq)

    def _notify(self, seq: _Sequence) -> None:
        assert seq.listener is not None
        try:
            seq.listener(seq.result(None, self._version))
        except Exception:
            logger.exception("stream listener failed", extra={"resource": self.resource_id})

    def _resolve(self, seq: _Sequence, finish: FinishReason) -> None:
        self._requests_finished += 1
        seq.future.set_result(seq.result(finish, self._version))

    def _finish(self, seq: _Sequence, finish: FinishReason) -> None:
        """Resolves a request outside `_step` and frees its slot at once."""
        self._resolve(seq, finish)
        if seq in self._waiting:
            self._waiting.remove(seq)
        else:
            self._release(seq)

    def _abort_all_now(self, message: str) -> int:
        victims = [*self._running, *self._waiting]
        for seq in self._running:
            self._prefixes.keep(seq)
        for seq in victims:
            self._resolve(seq, _abort_reason(seq, message))
        self._running.clear()
        self._waiting.clear()
        return len(victims)

    def _release(self, seq: _Sequence) -> None:
        """Removes a running sequence, moving the last one into its slot to keep the batch contiguous."""
        self._prefixes.keep(seq)
        last = self._running[-1]
        if last is not seq:
            self._runner.cache.copy_slot(last.slot, seq.slot, last.cached_len)
            last.slot = seq.slot
            self._running[seq.slot] = last
        self._running.pop()
        seq.slot = -1


class _PrefixCache:
    """KV of finished sequences in spare slots, reused by prompts that start with them (LRU)."""

    MIN_REUSE = 8  # shorter matches are not worth a copy

    def __init__(self, cache: SlotKVCache, first_slot: int, num_slots: int) -> None:
        self._cache = cache
        self._free = list(range(first_slot, first_slot + num_slots))
        self._entries: OrderedDict[int, list[int]] = OrderedDict()  # slot -> tokens whose KV it holds

    def clear(self) -> None:
        self._free.extend(self._entries)
        self._entries.clear()

    def keep(self, seq: _Sequence) -> None:
        """Copies a leaving sequence's KV into a spare slot (evicting the least recently used)."""
        if seq.slot < 0 or seq.cached_len < self.MIN_REUSE or not (self._free or self._entries):
            return
        tokens = (seq.prompt + seq.out_ids)[: seq.cached_len]
        for slot, held in list(self._entries.items()):  # an entry this one extends is redundant
            if len(held) <= len(tokens) and tokens[: len(held)] == held:
                del self._entries[slot]
                self._free.append(slot)
        slot = self._free.pop() if self._free else self._entries.popitem(last=False)[0]
        self._cache.copy_slot(seq.slot, slot, seq.cached_len)
        self._entries[slot] = tokens

    def restore(self, prompt: list[int], slot: int) -> int:
        """Copies the longest cached prefix of `prompt` (keeping >= 1 token to feed) into `slot`."""
        best_slot, best = -1, 0
        limit = len(prompt) - 1
        for held_slot, held in self._entries.items():
            n = _common_prefix(held, prompt, limit)
            if n > best:
                best_slot, best = held_slot, n
        if best < self.MIN_REUSE:
            return 0
        self._cache.copy_slot(best_slot, slot, best)
        self._entries.move_to_end(best_slot)
        return best


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _abort_reason(seq: _Sequence, message: str) -> FinishReason:
    return FinishReason("abort", message=message if seq.out_ids else ABORT_BEFORE_PREFILL)


def _eos_ids(model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _load_model(path: Path, device: str, dtype: str) -> Any:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a service log is no place for progress bars
    if not (path / "config.json").is_file():
        raise WeightLoadError(f"model_path={str(path)!r} is not a Hugging Face model directory (no config.json)")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype], local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise WeightLoadError(f"cannot load the model at {str(path)!r}: {e}") from e
    model.to(torch.device(device))
    model.eval()
    model.requires_grad_(False)
    return model

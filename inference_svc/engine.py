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

The parts: `batching` (request records, the command inbox, admission and slot bookkeeping, per-request
seeding), `prefix_cache` (reuse of finished requests' KV), `model_loading`, `model_runner` (the batched
forward), `grammar` (constrained decoding: each constrained request's matcher masks its row's logits) and
`sampling`. This module is the engine's public face and its decode loop.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import torch

from inference_svc.batching import Batch, Command, Inbox, RequestState, abort_reason, new_request, validate_request
from inference_svc.config import InferenceConfig
from inference_svc.grammar import GrammarCompiler, mask_logits
from inference_svc.model_loading import DTYPES, eos_token_ids, load_model
from inference_svc.model_runner import BatchRunner, SlotKVCache, model_shape
from inference_svc.prefix_cache import PrefixCache
from inference_svc.sampling import sample_rows
from inference_svc.weights import apply_state, read_checkpoint, resolve_inside
from schemas.inference.control import EngineControl
from schemas.inference.errors import EngineClosedError, InferenceError, InvalidRequestError
from schemas.inference.types import (
    MAX_WEIGHT_VERSION,
    PAUSE_MODES,
    EngineStats,
    GenerationResult,
    SamplingOptions,
    WeightUpdateResult,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class NativeEngine(EngineControl):
    """Continuous-batching engine over a local Hugging Face model directory (see the module doc)."""

    def __init__(
        self,
        model_path: Path | str,
        *,
        max_running_requests: int = 64,
        max_context: int = 32_768,
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
        self._model: Any = load_model(self.model_path, device, dtype)
        shape = model_shape(self._model)
        self.vocab_size = shape.vocab_size
        self.max_context = min(max_context, shape.max_positions)
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = eos_token_ids(self._model)
        self.model_type: str = self._model.config.model_type
        self.architectures: list[str] = list(getattr(self._model.config, "architectures", None) or [])
        self._grammars = GrammarCompiler(self.model_path, self.vocab_size, self.eos_token_ids)
        cache = SlotKVCache(
            shape, max_running_requests + prefix_cache_slots, min(kv_initial_tokens, self.max_context),
            self.max_context, DTYPES[dtype], torch.device(device),
        )
        prefixes = PrefixCache(cache, first_slot=max_running_requests, num_slots=prefix_cache_slots)
        self._batch = Batch(cache, prefixes, max_running_requests, max_prefill_tokens)
        self._runner = BatchRunner(self._model, cache)
        self._seed = seed
        self._arrivals = itertools.count(1)
        self._version = weight_version
        self._paused = False
        self._closed = False
        self._inbox = Inbox()
        self._tokens_generated = 0
        self._tokens_by_version: dict[int, int] = {}  # written by the loop only; dict() copies it atomically
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
        return validate_request(input_ids, sampling, self.vocab_size, self.max_context)

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
        matcher = self._grammars.matcher(sampling, input_ids) if sampling.constrained else None
        arrival = next(self._arrivals)
        seed = sampling.seed if sampling.seed is not None else (self._seed * 1_000_003 + arrival)
        seq = new_request(rid or uuid.uuid4().hex, input_ids, sampling, max_new, seed=seed,
                          eos_ids=self.eos_token_ids, listener=listener, matcher=matcher)
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
            affected = len(self._batch.running) + len(self._batch.waiting)
            if mode == "abort":
                self._batch.abort_all("Aborted by pause_generation(mode=abort)", self._version)
            elif mode == "retract":
                self._batch.prefixes.clear()
                self._batch.drop_kv()
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
            for seq in self._batch.all():
                if seq.rid == rid:
                    self._batch.finish(seq, abort_reason(seq, "Aborted by abort_request"), self._version)
                    return True
            return False

        return self._call(run)

    def abort_all(self) -> int:
        return self._call(lambda: self._batch.abort_all("Aborted by abort_request(abort_all=True)", self._version))

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
                self._batch.abort_all("Aborted by update_weights_from_disk(abort_all_requests=True)", self._version)
            apply_state(self._model, state)
            self._runner.refresh()
            self._batch.prefixes.clear()
            self._version = self._version + 1 if weight_version is None else weight_version
            self._batch.drop_kv()  # re-prefill prompt + generated with the new weights
            held = len(self._batch.running) + len(self._batch.waiting) if self._paused else 0
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
            self._batch.prefixes.clear()
            return True

        return self._call(run)

    def snapshot(self) -> list[GenerationResult]:
        """Partial results of every running and queued request, taken at a token boundary."""
        return self._call(lambda: [s.result(None, self._version) for s in self._batch.all()])

    def tokens_by_version(self) -> dict[int, int]:
        """Tokens sampled under each policy version (what a token/s per version is the rate of)."""
        return dict(self._tokens_by_version)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._batch.running),
            queued=len(self._batch.waiting),
            paused=self._paused,
            weight_version=self._version,
            tokens_generated=self._tokens_generated,
            requests_finished=self._batch.requests_finished,
        )

    # ----- loop --------------------------------------------------------------------------------

    def _call(self, run: Callable[[], _T]) -> _T:
        if threading.current_thread() is self._thread:
            return run()
        if self._closed or (self._started and not self._thread.is_alive()):
            raise EngineClosedError("the engine is shut down")
        future: Future[_T] = Future()
        self._inbox.put(Command(run, future))
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
            idle = self._paused or not self._batch
            if not self._inbox.drain(block=idle, queue_request=self._batch.waiting.append):
                return
            if self._paused or not self._batch:
                continue
            try:
                self._step()
            except Exception as e:  # the engine keeps serving: only the batch in flight fails
                logger.exception("engine step failed", extra={"resource": self.resource_id})
                self._batch.fail_running(InferenceError(f"engine step failed: {e}"))

    def _fail_leftovers(self) -> None:
        closed = EngineClosedError("the engine was shut down")
        self._batch.fail_all(closed)
        self._inbox.fail_all(closed)

    def _step(self) -> None:
        self._batch.admit(self._version)
        prefill = [s for s in self._batch.running if s.pending() > 1]
        decode = [s for s in self._batch.running if s.pending() == 1]
        for group in self._batch.prefill_groups(prefill):
            self._extend_and_sample(group)
        if decode:
            self._extend_and_sample(decode)
        self._batch.release_finished()

    def _extend_and_sample(self, group: list[RequestState]) -> None:
        logits = self._runner.extend(
            [s.slot for s in group], [s.cached_len for s in group], [s.uncached_tokens() for s in group]
        )
        mask_logits(logits, [s.matcher for s in group])
        uniforms = torch.cat([torch.rand(1, generator=s.generator) for s in group])
        tokens, logprobs = sample_rows(logits, [s.sampling for s in group], uniforms)
        version = self._version
        for seq, tok, lp in zip(group, tokens.tolist(), logprobs.tolist(), strict=True):
            self._tokens_generated += 1
            if finish := seq.accept(tok, lp, version, self.max_context, self.eos_token_ids):
                self._batch.resolve(seq, finish, version)
            elif seq.listener is not None:
                self._notify(seq)
        self._tokens_by_version[version] = self._tokens_by_version.get(version, 0) + len(group)

    def _notify(self, seq: RequestState) -> None:
        assert seq.listener is not None
        try:
            seq.listener(seq.result(None, self._version))
        except Exception:
            logger.exception("stream listener failed", extra={"resource": self.resource_id})

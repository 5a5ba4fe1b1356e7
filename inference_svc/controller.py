"""Control of one rollout resource, as plain calls: the Kafka consumer of the `control` topic calls these.

`InferenceController` turns PauseRollout / ResumeRollout / LoadWeights / abort commands into engine
calls and returns what the acknowledgement events need (timings in ms, request counts). It drives any
`schemas.inference.control.EngineControl`: the in-process `NativeEngine`, or `client.RemoteEngineControl`
for SGLang.
A failed weight load is reported (ok=False, error=...) rather than raised, whatever it raised: the old
weights stay live, and a pause the load made is lifted in every case, so the engine goes on serving.

LoadWeights carries the checkpoint's sha256 (`weights` defines the digest) and the engine checks it
over the bytes it swaps in. A command without one (the scheduler sends "" only for version 0, the
weights engines start from) loads only the controller's `startup_weights`, the directory the operator
configured at start-up; any other unverified load is refused (`require_sha256`, on by default).

`describe_resource` gives the ResourceRegistered facts (device kind, memory, bandwidth, peak FLOP/s):
declared in the config, looked up for known GPUs, or measured (a matmul and a tensor copy).
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import torch

from inference_svc.config import InferenceConfig
from schemas.inference.control import EngineControl
from schemas.inference.errors import InferenceError, InvalidRequestError
from schemas.inference.types import PAUSE_MODES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PauseAck:
    resource_id: str
    mode: str
    num_requests: int  # held (in_place, retract) or aborted (abort); -1 if the engine does not say
    pause_ms: float  # until the engine stood at a token boundary


@dataclass(frozen=True)
class ResumeAck:
    resource_id: str
    paused_ms: float  # how long generation stood still since on_pause (0 if it was not paused)


@dataclass(frozen=True)
class LoadWeightsResult:
    resource_id: str
    version: int  # the version now served (the old one when ok is False)
    ok: bool
    error: str
    pause_ms: float  # generation stood still this long for the swap (pause -> resume)
    load_ms: float  # reading + validating + applying the checkpoint
    num_paused_requests: int


@dataclass(frozen=True)
class AbortAck:
    resource_id: str
    num_aborted: int
    duration_ms: float


class InferenceController:
    """Plain object the control consumer calls; safe to call from several threads."""

    def __init__(
        self,
        engine: EngineControl,
        resource_id: str,
        *,
        startup_weights: Path | None = None,
        require_sha256: bool = True,
    ) -> None:
        self.engine = engine
        self.resource_id = resource_id
        self.startup_weights = startup_weights
        self.require_sha256 = require_sha256
        self._lock = threading.Lock()
        self._paused_since: float | None = None
        self._pause_mode: str | None = None

    @property
    def paused(self) -> bool:
        return self._paused_since is not None

    def on_pause(self, mode: str = "abort") -> PauseAck:
        """PauseRollout: abort = preemption (partials go back to their callers), in_place = hold."""
        if mode not in PAUSE_MODES:
            raise InvalidRequestError(f"mode={mode!r}: expected one of {', '.join(PAUSE_MODES)}")
        with self._lock:
            started = time.perf_counter()
            held = self.engine.pause(mode)
            if self._paused_since is None:
                self._paused_since = started
            self._pause_mode = mode
            ack = PauseAck(self.resource_id, mode, held, _ms_since(started))
        logger.info("pause", extra={"resource": self.resource_id, "mode": mode, "requests": held})
        return ack

    def on_resume(self) -> ResumeAck:
        with self._lock:
            self.engine.resume()
            paused_ms = 0.0 if self._paused_since is None else _ms_since(self._paused_since)
            self._paused_since, self._pause_mode = None, None
        logger.info("resume", extra={"resource": self.resource_id, "paused_ms": paused_ms})
        return ResumeAck(self.resource_id, paused_ms)

    def on_load_weights(self, uri: str, version: int, sha256: str = "") -> LoadWeightsResult:
        """LoadWeights: pause in place, swap, resume; running requests continue under `version`.

        If the resource was already paused (e.g. preempted for training), it stays paused afterwards.
        Any failure (a bad checkpoint, a wrong digest, or an unexpected error) is returned as ok=False.
        """
        with self._lock:
            was_paused = self._paused_since is not None
            started = time.perf_counter()
            load_started = started
            paused_here = False
            try:
                path = weights_path_from_uri(uri)
                self._check_verifiable(path, version, sha256)
                if not was_paused:
                    self.engine.pause("in_place")
                    paused_here = True
                load_started = time.perf_counter()
                result = self.engine.update_weights_from_disk(path, version, sha256=sha256 or None)
            except Exception as e:  # reported, never raised: the control loop must survive any load
                expected = isinstance(e, InferenceError)
                logger.error("weight load failed", exc_info=None if expected else e,
                             extra={"resource": self.resource_id, "version": version, "error": str(e)[:300]})
                error = str(e) if expected else f"weight load failed unexpectedly: {type(e).__name__}: {e}"
                return LoadWeightsResult(
                    self.resource_id, self._served_version(), False, error, _ms_since(started),
                    _ms_since(load_started), 0,
                )
            finally:
                if paused_here:
                    self._resume_after_load()
            load_ms = _ms_since(load_started)
            if not was_paused:
                pause_ms = _ms_since(started)
            elif self._pause_mode == "in_place" and self._paused_since is not None:
                pause_ms = _ms_since(self._paused_since)  # the weight sync's own pause, so far
            else:
                pause_ms = 0.0  # preempted (abort): the engine was stopped for another task, not for the swap
        logger.info(
            "weights loaded",
            extra={"resource": self.resource_id, "version": result.weight_version, "pause_ms": pause_ms},
        )
        return LoadWeightsResult(
            self.resource_id, result.weight_version, True, "", pause_ms, load_ms, result.num_paused_requests
        )

    def _check_verifiable(self, path: Path, version: int, sha256: str) -> None:
        if sha256 or not self.require_sha256:
            return
        startup = self.startup_weights
        try:
            is_startup = startup is not None and path.resolve() == startup.resolve()
        except (OSError, ValueError, RuntimeError):
            is_startup = False
        if not is_startup:
            raise InvalidRequestError(
                f"LoadWeights(version={version}, uri={str(path)[:200]!r}) carries no sha256: only the start-up "
                f"weights ({str(startup) if startup else 'none'}) load unverified"
            )

    def _resume_after_load(self) -> None:
        try:
            self.engine.resume()
        except Exception:  # the engine loop is gone: nothing left to resume, the load result says why
            logger.exception("resume after a weight load failed", extra={"resource": self.resource_id})

    def _served_version(self) -> int:
        try:
            return int(self.engine.weight_version)
        except Exception:
            return -1

    def on_abort_all(self) -> AbortAck:
        with self._lock:
            started = time.perf_counter()
            aborted = self.engine.abort_all()
            return AbortAck(self.resource_id, aborted, _ms_since(started))


def weights_path_from_uri(uri: str) -> Path:
    """file:///dir, or a plain local path. Other schemes are refused (the trainer publishes to disk)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    raise InvalidRequestError(f"uri={uri!r}: only file:// URIs and local paths can be loaded")


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


# ----- resource description ----------------------------------------------------------------------

# Declared dense bf16 peak FLOP/s and HBM bandwidth (bytes/s) of common GPUs, from vendor data sheets.
KNOWN_GPUS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
}


@dataclass(frozen=True)
class ResourceDescription:
    """The facts of a ResourceRegistered event; `measured` says whether numbers came from a benchmark."""

    resource_id: str
    device_kind: str  # "cpu" or "cuda"
    device_name: str
    num_devices: int
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s
    peak_flops: float
    measured: bool

    @property
    def ridge_point(self) -> float:
        """Roofline ridge (FLOP per byte): high means compute-rich, a better train resource."""
        return self.peak_flops / self.hbm_bandwidth


def describe_resource(config: InferenceConfig, measure_s: float = 0.2) -> ResourceDescription:
    """Declared values from the config win; then the GPU table; then a quick measurement."""
    device = torch.device(config.device)
    kind = device.type
    if kind == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = str(props.name), int(props.total_memory)
        known = next((v for k, v in KNOWN_GPUS.items() if k in name), None)
    else:
        name, memory, known = _cpu_name(), _host_memory_bytes(), None
    measured = False
    peak, bandwidth = config.peak_flops, config.hbm_bandwidth
    if peak is None:
        if known is not None:
            peak = known[0]
        else:
            peak, measured = measure_matmul_flops(device, measure_s), True
    if bandwidth is None:
        if known is not None:
            bandwidth = known[1]
        else:
            bandwidth, measured = measure_copy_bandwidth(device, measure_s), True
    return ResourceDescription(
        resource_id=config.resource_id,
        device_kind=kind,
        device_name=name,
        num_devices=1,
        memory_bytes=config.memory_bytes or memory,
        hbm_bandwidth=bandwidth,
        peak_flops=peak,
        measured=measured,
    )


def measure_matmul_flops(device: torch.device, min_time_s: float = 0.2, size: int = 512) -> float:
    """Sustained FLOP/s of square matmuls (fp32 on CPU, bf16 on GPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up
    return 2 * size**3 * _repeat_for(lambda: torch.matmul(a, b), device, min_time_s)


def measure_copy_bandwidth(device: torch.device, min_time_s: float = 0.2, nbytes: int = 64 << 20) -> float:
    """Bytes moved per second by a large tensor copy (each copy reads and writes `nbytes`)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    return 2 * nbytes * _repeat_for(lambda: dst.copy_(src), device, min_time_s)


def _repeat_for(op: Callable[[], object], device: torch.device, min_time_s: float) -> float:
    """Runs `op` until `min_time_s` has passed; returns calls per second."""
    calls, started = 0, time.perf_counter()
    while True:
        op()
        calls += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        if elapsed >= min_time_s:
            return calls / elapsed


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0

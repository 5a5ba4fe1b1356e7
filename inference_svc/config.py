"""Configuration of one inference service instance (one rollout resource).

Validated at start-up: a bad value raises `pydantic.ValidationError`, whose message names the field
and the offending input (e.g. ``max_context  Input should be greater than or equal to 2
[input_value=1]``).

Control plane security (one rule, checked here at start-up):
- `control_key` set (or `SFLOW_INFERENCE_KEY` in the environment): the control endpoints
  (/pause_generation, /continue_generation, /abort_request, /update_weights_from_disk, /flush_cache)
  answer 401 unless the request carries `Authorization: Bearer <key>`; `schemas.inference.client` sends
  the key from the same variable, so the proxy and the tests need no change beyond sharing it.
- no key: the service binds to loopback only (`host` 127.0.0.0/8, ::1 or localhost); any other
  host is refused at start-up, so an unauthenticated control plane is never reachable from the network.
Hot swaps load only from `weights_roots` (the start-up `model_path` and `weights_root`).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from schemas.inference.control import CONTROL_KEY_ENV, control_key_from_env

_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")
DTYPES = ("float32", "bfloat16", "float16")
def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class InferenceConfig(BaseModel):
    """What `python -m inference_svc` needs to serve one model on one resource."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path = Field(
        description="Local Hugging Face model directory (config.json + safetensors). Nothing is downloaded."
    )
    resource_id: str = Field(
        default="rollout-0", min_length=1, description="Name of this resource in the scheduler's pool."
    )
    backend: Literal["native", "sglang"] = Field(
        default="native",
        description="native = the torch engine of this package (CPU or GPU); sglang = launch SGLang (GPU).",
    )
    host: str = Field(default="127.0.0.1", description="Interface the HTTP server binds to.")
    port: int = Field(default=30000, ge=0, le=65535, description="HTTP port (0 = pick a free one).")
    max_running_requests: int = Field(
        default=64, ge=1, le=4096, description="Sequences decoded together; more requests wait in a queue."
    )
    max_context: int = Field(
        default=32_768,
        ge=2,
        description="Longest prompt + output in tokens (capped by the model's max_position_embeddings).",
    )
    device: str = Field(default="cpu", description="torch device of the native engine: cpu, cuda, cuda:N.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Weights and KV-cache dtype of the native engine."
    )
    seed: int = Field(
        default=0, description="Seeds requests that carry no sampling_seed, so a run is reproducible."
    )
    weight_version: int = Field(
        default=0, ge=0, description="Policy version of the weights in model_path at start-up."
    )
    num_threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads for the native engine (None = torch default)."
    )
    kv_initial_tokens: int = Field(
        default=256, ge=16, description="Initial KV-cache length per slot; it doubles as needed up to max_context."
    )
    prefix_cache_slots: int = Field(
        default=8,
        ge=0,
        description="Finished sequences whose KV is kept so a call that extends one prefills only the rest.",
    )
    peak_flops: float | None = Field(
        default=None, gt=0, description="Declared peak FLOP/s of the resource (None = measure or look up)."
    )
    hbm_bandwidth: float | None = Field(
        default=None, gt=0, description="Declared memory bandwidth in bytes/s (None = measure or look up)."
    )
    memory_bytes: int | None = Field(
        default=None, gt=0, description="Declared device memory in bytes (None = ask the device)."
    )
    join_bus: bool = Field(
        default=False,
        description="Join the bus: register the resource, send heartbeats, obey control events (needs Kafka: "
        "SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX).",
    )
    capabilities: tuple[Literal["rollout", "train", "reference", "critic"], ...] = Field(
        default=("rollout",), description="Capability tags the resource may take (registered with it)."
    )
    served_model_name: str = Field(default="default", description="Model name of WeightsPublished/Loaded events.")
    advertise_url: str | None = Field(
        default=None, description="URL other services reach this engine at (None: http://host:port)."
    )
    heartbeat_interval_s: float = Field(default=2.0, gt=0, description="Seconds between heartbeats.")
    sglang_args: tuple[str, ...] = Field(
        default=(), description="Extra command-line flags passed to `sglang.launch_server`."
    )
    sglang_startup_timeout_s: float = Field(
        default=900.0, gt=0, description="How long to wait for SGLang's /health_generate after launch."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")
    control_key: SecretStr | None = Field(
        default_factory=control_key_from_env,
        description=f"Bearer key the control endpoints require (default: ${CONTROL_KEY_ENV}; prefer the variable, "
        "a flag shows in the process list). None: the service must bind to loopback.",
    )
    weights_root: Path | None = Field(
        default=None,
        description="Directory hot swaps (LoadWeights, /update_weights_from_disk) may load checkpoints from, "
        "besides model_path itself; paths resolving outside (.., symlinks) are refused with 403.",
    )
    max_body_bytes: int = Field(
        default=8 << 20, ge=1024, description="Largest request body accepted (larger: 413)."
    )
    max_json_depth: int = Field(
        default=32, ge=4, le=1000, description="Deepest JSON nesting accepted in a request body (deeper: 400)."
    )

    @field_validator("model_path")
    @classmethod
    def _model_dir_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model_path={str(value)!r} is not a directory")
        if not (value / "config.json").is_file():
            raise ValueError(f"model_path={str(value)!r} has no config.json (not a Hugging Face model dir)")
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not _DEVICE_RE.match(value):
            raise ValueError(f"device={value!r}: expected cpu, cuda or cuda:N")
        return value

    @field_validator("host")
    @classmethod
    def _non_empty_host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host='' : give an interface such as 127.0.0.1")
        return value

    @model_validator(mode="after")
    def _no_open_control_plane(self) -> InferenceConfig:
        if self.control_key is None and not is_loopback(self.host):
            raise ValueError(
                f"host={self.host!r} is not a loopback address and no control_key is set: the control endpoints "
                f"(pause, load weights, abort) would be open to the network; set ${CONTROL_KEY_ENV} or bind 127.0.0.1"
            )
        if self.control_key is not None and not self.control_key.get_secret_value().strip():
            raise ValueError("control_key='' : give a non-empty key, or none")
        return self

    @property
    def weights_roots(self) -> tuple[Path, ...]:
        """Where hot swaps may read: the start-up weights and the configured weights root."""
        return (self.model_path,) if self.weights_root is None else (self.model_path, self.weights_root)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

"""Configuration of the capture proxy (`python -m agents_adapter.proxy`).

Validated at start-up: a bad value raises `ConfigError` (or pydantic's `ValidationError`), whose message
names the field and the offending value.

API keys are never kept in clear: every key is stored as its sha256 hex digest and a request's
bearer token is hashed before the lookup. Keys come from a file (`api_keys_file`) and/or the
environment variable named by `api_keys_env`, one `AGENT_ID KEY` entry per line in the file or
`AGENT_ID=KEY` entries separated by commas in the variable, where KEY is either `sha256:<64 hex>` (the
recommended form: the file then holds no secret) or the key itself (hashed at once on load). The admin
key comes the same way from `admin_key_sha256`, or `SFLOW_ADAPTER_ADMIN_KEY` (clear, hashed on load) /
`SFLOW_ADAPTER_ADMIN_KEY_SHA256`. `python -m agents_adapter.proxy --hash-key KEY` prints a key's digest.

Limits on what one request may ask (each refusal names the limit and the value): `max_body_bytes`
(413), `max_json_depth`, `max_messages`, `max_batch_prompts`, `max_abs_reward` (400),
`max_inflight_per_agent` (429 with `Retry-After: retry_after_s`). Engine protection:
`greedy_below_temperature` (a tinier temperature is sent as 0 = greedy: dividing logits by it
overflows) and `max_engine_errors_per_call` (an engine that answers 5xx to a call is not sent it
again and again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agents_adapter.errors import ConfigError
from agents_adapter.proxy.openai_models import BodyLimits
from bus.config import BusConfig
from bus.errors import BusError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_AGENT_ID = re.compile(r"^[A-Za-z0-9._:@/-]{1,128}$")
HASH_PREFIX = "sha256:"
API_KEYS_ENV = "SFLOW_ADAPTER_API_KEYS"
ADMIN_KEY_ENV = "SFLOW_ADAPTER_ADMIN_KEY"
ADMIN_KEY_SHA256_ENV = "SFLOW_ADAPTER_ADMIN_KEY_SHA256"


def hash_api_key(key: str) -> str:
    """sha256 hex digest of a key: the only form in which the proxy keeps keys."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _key_digest(entry: str, where: str) -> str:
    """A `sha256:<hex>` entry as its digest, a clear key hashed."""
    if entry.startswith(HASH_PREFIX):
        digest = entry[len(HASH_PREFIX) :].lower()
        if not _HEX64.match(digest):
            raise ConfigError(f"{where}: {entry[:16]!r}... is not sha256:<64 hex digits>")
        return digest
    if not entry:
        raise ConfigError(f"{where}: empty API key")
    return hash_api_key(entry)


def parse_key_lines(text: str, where: str) -> dict[str, str]:
    """`AGENT_ID KEY` lines ('#' comments, blank lines ignored) as {digest: agent_id}."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{where} line {number}: expected 'AGENT_ID KEY', got {len(parts)} fields")
        _add_key(out, parts[0], parts[1], f"{where} line {number}")
    return out


def parse_key_env(value: str, where: str) -> dict[str, str]:
    """`AGENT_ID=KEY,AGENT_ID=KEY` as {digest: agent_id}."""
    out: dict[str, str] = {}
    for i, item in enumerate(filter(None, (p.strip() for p in value.split(","))), start=1):
        agent, sep, key = item.partition("=")
        if not sep:
            raise ConfigError(f"{where} entry {i}: expected AGENT_ID=KEY")
        _add_key(out, agent.strip(), key.strip(), f"{where} entry {i}")
    return out


def _add_key(out: dict[str, str], agent_id: str, key: str, where: str) -> None:
    if not _AGENT_ID.match(agent_id):
        raise ConfigError(f"{where}: agent id {agent_id!r} must be 1-128 of [A-Za-z0-9._:@/-]")
    digest = _key_digest(key, where)
    if digest in out and out[digest] != agent_id:
        raise ConfigError(f"{where}: the same key is given to {out[digest]!r} and {agent_id!r}")
    out[digest] = agent_id


class StaticEndpoint(BaseModel):
    """An inference server the proxy routes to without any event (simple setups, tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource_id: str = Field(min_length=1, description="Resource id (matches control/scheduler events if any).")
    url: str = Field(description="Base URL of the SGLang-protocol server, e.g. http://127.0.0.1:30000.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"url={value!r} must be http(s)://host:port")
        return value.rstrip("/")

    @classmethod
    def parse(cls, spec: str, index: int) -> StaticEndpoint:
        """`RESOURCE_ID=URL` or a bare URL (resource id `static-<index>`)."""
        rid, sep, url = spec.partition("=")
        if sep and not rid.startswith("http"):
            return cls(resource_id=rid.strip(), url=url.strip())
        return cls(resource_id=f"static-{index}", url=spec.strip())


class AdapterConfig(BaseModel):
    """What the capture proxy needs: model (tokenizer + chat template), keys, engines, caches, Kafka."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    host: str = Field(default="127.0.0.1", description="Interface to bind; the default keeps the proxy local.")
    port: int = Field(default=8100, ge=0, le=65535, description="HTTP port (0 = pick a free one).")
    model_path: Path = Field(description="Local Hugging Face model dir: its tokenizer and chat template are used.")
    served_model_name: str = Field(
        default="", description="Model name agents must send ('' = the model directory's name)."
    )
    instance_id: str = Field(
        default="adapter-0", min_length=1, description="Producer id written in every event of this instance."
    )
    agent_keys: dict[str, str] = Field(
        default_factory=dict, description="{sha256 hex of an API key: agent id}; filled from the file / env."
    )
    api_keys_file: Path | None = Field(default=None, description="File of 'AGENT_ID KEY' lines (KEY = sha256:<hex>).")
    api_keys_env: str = Field(default=API_KEYS_ENV, description="Env var with AGENT_ID=KEY,... entries.")
    admin_key_sha256: str | None = Field(default=None, description="sha256 hex of the admin key (None: no admin).")
    inference_endpoints: tuple[StaticEndpoint, ...] = Field(
        default=(), description="Static rollout resources, always routed to unless events pause them."
    )
    routing_from_events: bool = Field(
        default=True, description="Follow resources/scheduler/control events to learn and track rollout resources."
    )
    sticky_sessions: bool = Field(default=True, description="Keep a session on the same resource (prefix cache).")
    unreachable_cooldown_s: float = Field(
        default=5.0, gt=0, description="How long a resource that refused connections is skipped."
    )
    session_cache_size: int = Field(default=10_000, ge=1, description="Sessions kept in memory (LRU beyond).")
    session_ttl_s: float = Field(default=3600.0, gt=0, description="Idle time after which a session is forgotten.")
    session_store_path: Path | None = Field(
        default=None,
        description="SQLite file of the durable session state (owners, call counts, ends, retried requests' "
        "answers; see agents_adapter.proxy.session_store), so that sessions survive a proxy restart. None: kept in "
        "memory, surviving cache eviction only.",
    )
    calls_cached_per_session: int = Field(
        default=16, ge=1, description="Served calls whose exact token ids a session keeps for token-in/token-out."
    )
    responses_kept: int = Field(
        default=100_000, ge=1, description="Responses (`/v1/responses`) kept in memory for `previous_response_id` "
        "(LRU beyond, and forgotten after session_ttl_s idle); each keeps only the messages its request added.",
    )
    max_prompt_tokens: int = Field(default=32_768, ge=1, description="Longest prompt accepted, in tokens.")
    max_context_tokens: int | None = Field(
        default=None, ge=2, description="Prompt + output limit (None: the model's max_position_embeddings)."
    )
    default_max_tokens: int = Field(
        default=512, ge=1, description="Output budget of a request that gives no max_tokens (capped by the context)."
    )
    max_n: int = Field(default=16, ge=1, description="Largest `n` (choices per request).")
    long_request_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest a call may be held (waiting for a resource, paused, resumed)."
    )
    avoid_grace_s: float = Field(
        default=1.0, ge=0, description="How long a call preempted on a resource waits for another before going back."
    )
    max_segments: int = Field(
        default=16, ge=1, description="Engine runs one call may be stitched from before it fails with 503."
    )
    max_engine_connections: int = Field(default=512, ge=1, description="HTTP connections per engine.")
    max_engine_errors_per_call: int = Field(
        default=2, ge=1,
        description="HTTP 5xx answers from engines after which a call fails (503) instead of being sent again.",
    )
    greedy_below_temperature: float = Field(
        default=1e-5, ge=0, le=0.1, allow_inf_nan=False,
        description="A temperature below this is sent to the engine as 0 (greedy), as vLLM does.",
    )
    max_body_bytes: int = Field(
        default=8 * 2**20, ge=1024, description="Largest request body (413 beyond; the rest is not read)."
    )
    max_json_depth: int = Field(
        default=64, ge=4, le=500, description="Deepest nesting of arrays/objects in a body (400 beyond)."
    )
    max_messages: int = Field(
        default=BodyLimits.max_messages, ge=1, description="Most messages in one chat completion request."
    )
    max_batch_prompts: int = Field(
        default=BodyLimits.max_batch_prompts, ge=1, description="Most prompts in one /v1/completions batch."
    )
    max_abs_reward: float = Field(
        default=BodyLimits.max_abs_reward, gt=0, allow_inf_nan=False,
        description="Rewards must be finite and within +-this (400 otherwise).",
    )
    max_inflight_per_agent: int = Field(
        default=256, ge=1, description="Call requests one agent may have in flight (429 beyond)."
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 (seconds).")
    delivery_timeout_ms: int = Field(
        default=30000, ge=100,
        description="How long Kafka may take to acknowledge a call's events (the producer retries them "
                    "idempotently meanwhile: a broker failover takes seconds) before a 503.",
    )
    producer_linger_ms: int = Field(default=0, ge=0, description="Producer batching delay (0: lowest latency).")
    bus: BusConfig = Field(
        default_factory=lambda: BusConfig.from_env(client_id="agents-adapter"),
        description="Kafka (bootstrap servers, topic prefix); default from SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")

    @field_validator("model_path")
    @classmethod
    def _model_dir(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model_path={str(value)!r} is not a directory")
        if not any((value / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"model_path={str(value)!r} has no tokenizer (tokenizer.json / tokenizer_config.json)")
        return value

    @field_validator("session_store_path")
    @classmethod
    def _store_path(cls, value: Path | None) -> Path | None:
        if value is not None and (value.is_dir() or (value.parent.exists() and not value.parent.is_dir())):
            raise ValueError(f"session_store_path={str(value)!r} must be a file path in a directory")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host='': give an interface such as 127.0.0.1")
        return value

    @field_validator("agent_keys")
    @classmethod
    def _hashed_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for digest, agent in value.items():
            if not _HEX64.match(digest):
                raise ValueError(f"agent_keys has {digest[:12]!r}... for {agent!r}: keys must be sha256 hex digests")
            if not _AGENT_ID.match(agent):
                raise ValueError(f"agent_keys: agent id {agent!r} must be 1-128 of [A-Za-z0-9._:@/-]")
        return value

    @field_validator("admin_key_sha256")
    @classmethod
    def _admin_hash(cls, value: str | None) -> str | None:
        if value is not None and not _HEX64.match(value.lower()):
            raise ValueError(f"admin_key_sha256={value[:12]!r}... is not a sha256 hex digest")
        return None if value is None else value.lower()

    @model_validator(mode="after")
    def _consistent(self) -> AdapterConfig:
        ids = [e.resource_id for e in self.inference_endpoints]
        if len(set(ids)) != len(ids):
            raise ValueError(f"inference_endpoints has duplicate resource ids: {ids}")
        if self.max_context_tokens is not None and self.max_prompt_tokens >= self.max_context_tokens:
            raise ValueError(
                f"max_prompt_tokens={self.max_prompt_tokens} must be < max_context_tokens={self.max_context_tokens}"
            )
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path.name

    def body_limits(self) -> BodyLimits:
        return BodyLimits(self.max_messages, self.max_batch_prompts, self.max_abs_reward)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def context_tokens(self) -> int:
        """Prompt + output limit: configured, else the model's max_position_embeddings (else 4096, a
        conservative guess for a model directory that does not say)."""
        if self.max_context_tokens is not None:
            return self.max_context_tokens
        try:
            model_config = json.loads((self.model_path / "config.json").read_text(encoding="utf-8"))
            return int(model_config.get("max_position_embeddings") or 4096)
        except (OSError, ValueError):
            return 4096

    @classmethod
    def build(cls, env: Mapping[str, str] | None = None, **values: Any) -> AdapterConfig:
        """Validated config with the keys of `api_keys_file` and the environment merged in.

        Raises `ConfigError` naming the field and the bad value.
        """
        env = os.environ if env is None else env
        try:
            keys: dict[str, str] = dict(values.pop("agent_keys", {}) or {})
            keys_file = values.get("api_keys_file")
            if keys_file is not None:
                path = Path(keys_file)
                try:
                    text = path.read_text(encoding="utf-8")
                except OSError as e:
                    raise ConfigError(f"api_keys_file={str(path)!r} cannot be read: {e}") from e
                _merge(keys, parse_key_lines(text, f"api_keys_file={str(path)!r}"))
            env_name = values.get("api_keys_env", API_KEYS_ENV)
            if env.get(env_name):
                _merge(keys, parse_key_env(env[env_name], f"${env_name}"))
            if values.get("admin_key_sha256") is None:
                if env.get(ADMIN_KEY_SHA256_ENV):
                    values["admin_key_sha256"] = env[ADMIN_KEY_SHA256_ENV]
                elif env.get(ADMIN_KEY_ENV):
                    values["admin_key_sha256"] = hash_api_key(env[ADMIN_KEY_ENV])
            endpoints = values.get("inference_endpoints")
            if endpoints and isinstance(endpoints[0], str):
                values["inference_endpoints"] = tuple(StaticEndpoint.parse(s, i) for i, s in enumerate(endpoints))
            return cls(agent_keys=keys, **values)
        except ValidationError as e:
            raise ConfigError(str(e)) from e
        except BusError as e:
            raise ConfigError(f"bus: {e}") from e

    def redacted(self) -> dict[str, Any]:
        """The config for logs and /admin/stats: digests shortened, never a key."""
        data = self.model_dump(exclude={"agent_keys", "admin_key_sha256", "bus"})
        data["agents"] = sorted(set(self.agent_keys.values()))
        data["admin"] = self.admin_key_sha256 is not None
        data["bus"] = {"bootstrap_servers": self.bus.bootstrap_servers, "topic_prefix": self.bus.topic_prefix}
        return json.loads(json.dumps(data, default=str))


def _merge(into: dict[str, str], more: dict[str, str]) -> None:
    for digest, agent in more.items():
        if digest in into and into[digest] != agent:
            raise ConfigError(f"the same API key is given to {into[digest]!r} and {agent!r}")
        into[digest] = agent

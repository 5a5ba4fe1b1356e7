"""The inference service's result and option types: what its engines return and its clients read.

Plain dataclasses with no torch, so a light client (the capture proxy) can hold them; the native engine and the
SGLang backend both produce them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

PauseMode = Literal["abort", "in_place", "retract"]
PAUSE_MODES: tuple[str, ...] = ("abort", "in_place", "retract")
DEFAULT_MAX_NEW_TOKENS = 128
MAX_WEIGHT_VERSION = 2**63 - 1  # versions travel in Avro longs (Heartbeat, WeightsLoaded)
ABORT_BEFORE_PREFILL = "Abort before prefill"  # SGLang's message for a request that produced nothing


@dataclass(frozen=True)
class SamplingOptions:
    """Per-request sampling, SGLang semantics: temperature 0 (below `GREEDY_TEMPERATURE_FLOOR`) is greedy,
    top_k -1 is the whole vocabulary."""

    max_new_tokens: int | None = None  # None: min(128, room left in the context)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    # Constrained decoding (SGLang's fields; at most one is set): see inference_svc.grammar
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    grammar_prefix_tokens: int = 0  # our extension: the last N prompt tokens were generated under the grammar

    @property
    def constrained(self) -> bool:
        return any(g is not None for g in (self.json_schema, self.regex, self.ebnf, self.structural_tag))


@dataclass(frozen=True)
class FinishReason:
    type: Literal["stop", "length", "abort"]
    matched: int | None = None
    length: int | None = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        """SGLang's shapes: {type: stop, matched}, {type: length, length}, {type: abort, message, ...}."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message, "status_code": None, "err_type": None}


@dataclass
class GenerationResult:
    """What a request produced; `finish_reason` is None in a snapshot of a running request."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: FinishReason | None
    weight_version: int
    e2e_latency_s: float
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass(frozen=True)
class WeightUpdateResult:
    success: bool
    message: str
    weight_version: int
    load_ms: float  # reading + validating the checkpoint (off the decode loop)
    apply_ms: float  # copying it into the live model at a token boundary
    num_paused_requests: int


@dataclass(frozen=True)
class EngineStats:
    running: int
    queued: int
    paused: bool
    weight_version: int
    tokens_generated: int
    requests_finished: int

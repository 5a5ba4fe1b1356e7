"""Request bodies of the proxy's endpoints (OpenAI's chat / completions API, our session and token APIs).

Unknown fields are ignored, as OpenAI-compatible servers (vLLM, SGLang) do, so newer clients keep
working; fields we know but cannot honour (penalties, logit_bias, a forced tool choice, echo, ...)
are refused with a 400 that names them (`unsupported`). A forced tool choice and `response_format` are
served by constrained decoding (`constraints`). Ranges follow OpenAI's API reference.
Vendor extensions accepted like vLLM's: `top_k`, `ignore_eos`.

Size limits that depend on the proxy's config (messages per request, prompts per batch, the reward
bound) come in as the validation context (`BodyLimits`, from `AdapterConfig.body_limits()`), so the
400 is pydantic's like every other field error; without a context the defaults below apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from agents_adapter.errors import InvalidParameterError
from schemas.inference.protocol import SamplingParams


@dataclass(frozen=True)
class BodyLimits:
    """Per-request limits of the proxy (documented on `AdapterConfig`, whose defaults these are)."""

    max_messages: int = 1024
    max_batch_prompts: int = 64
    max_abs_reward: float = 1e6


def few_messages(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """The `messages` validator of every chat-shaped body: the count is refused before each message is
    parsed, so an oversized list costs nothing."""
    limit = _limits(info).max_messages
    if isinstance(value, list) and len(value) > limit:
        raise ValueError(f"{len(value)} messages; this proxy accepts at most max_messages={limit}")
    return value


def _limits(info: ValidationInfo) -> BodyLimits:
    context = info.context
    return context if isinstance(context, BodyLimits) else BodyLimits()


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (OpenAI's `developer` is the system role)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Sampling(_Body):
    """Fields shared by chat and text completions."""

    model: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: StrictInt = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    top_k: StrictInt | None = Field(default=None, description="vendor extension: -1 or >= 1")
    ignore_eos: bool = Field(default=False, description="vendor extension: generate the whole budget")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError(f"top_k={value} must be -1 (whole vocabulary) or >= 1")
        return value

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def check_supported(self) -> None:
        """400 for options we know but cannot honour (rather than silently ignoring them)."""
        if self.presence_penalty:
            raise unsupported("presence_penalty", "penalties are not supported (send 0 or omit it)")
        if self.frequency_penalty:
            raise unsupported("frequency_penalty", "penalties are not supported (send 0 or omit it)")
        if self.logit_bias:
            raise unsupported("logit_bias", "logit_bias is not supported")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)

    _few_messages = field_validator("messages", mode="before")(few_messages)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise unsupported("top_logprobs", "top_logprobs needs logprobs=true")

    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(default=16, ge=1)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _small_batch(cls, value: Any, info: ValidationInfo) -> Any:
        limit = _limits(info).max_batch_prompts
        is_batch = isinstance(value, list) and not all(isinstance(p, int) for p in value)
        if is_batch and len(value) > limit:
            raise ValueError(f"{len(value)} prompts in one batch; this proxy accepts at most max_batch_prompts={limit}")
        return value

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise unsupported("echo", "echo is not supported")
        if self.suffix:
            raise unsupported("suffix", "suffix (insertion) is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", "best_of must equal n (every sample is returned)")

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s): one text, one token list, or a batch of either."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise unsupported("prompt", "the prompt is empty")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TokenGenerateRequest(_Body):
    """POST /v1/generate: token-in / token-out for agents that tokenize themselves (SGLang's shape)."""

    model: str | None = None
    input_ids: list[StrictInt] = Field(min_length=1)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = True
    user: str | None = None
    metadata: dict[str, str] | None = None

    def check_supported(self) -> None:
        if self.sampling_params.structural_tag is not None or self.sampling_params.grammar_prefix_tokens:
            raise unsupported("sampling_params", "structural_tag and grammar_prefix_tokens are not served here: "
                                                 "send the grammar as json_schema, regex or ebnf")


class _Rewarded(_Body):
    """A body carrying a reward: finite and within +-max_abs_reward, since the trainer turns rewards into
    float32 advantages (1e300 becomes inf, then NaN for the whole group)."""

    @field_validator("reward", check_fields=False)
    @classmethod
    def _bounded(cls, value: float | None, info: ValidationInfo) -> float | None:
        bound = _limits(info).max_abs_reward
        if value is not None and not (math.isfinite(value) and abs(value) <= bound):
            raise ValueError(f"reward={value!r} must be a finite number within +-max_abs_reward={bound:g}")
        return value


class EndSessionRequest(_Rewarded):
    reward: float | None = Field(default=None, description="None: the reward comes later (/reward)")
    status: Literal["completed", "failed", "aborted"] = "completed"


class RewardRequest(_Rewarded):
    reward: float
    status: Literal["completed", "failed", "aborted"] | None = None


class DrainRequest(_Body):
    stop_accepting: bool = Field(default=True, description="False: accept calls again")
    timeout_s: float = Field(default=60.0, ge=0, le=3600)
    end_sessions: bool = Field(default=False, description="End open sessions (status aborted, reward 0)")


def unsupported(param: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{param}: {message}", param=param)

"""SGLang's native HTTP API (`/generate` and the control endpoints), as pydantic models.

Field names and response shapes follow SGLang's `GenerateReqInput`, `SamplingParams`,
`PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput` and `AbortReq` (python/sglang/srt/managers/
io_struct.py) and its http_server responses, so the same client drives the native engine and SGLang.
Requests refuse unknown fields (a typo is a 400, not a silently ignored option); responses keep
unknown fields, since SGLang's carry more than we read.

Our extensions: `sha256` of /update_weights_from_disk (the checkpoint digest, see `weights`; checked
before the swap when given), and `meta_info.output_token_versions`, the policy version that produced each output token
(a request that spans a weight swap has two versions). SGLang does not send it; `GenerateResponse.
token_versions()` then repeats `meta_info.weight_version` for every token.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from schemas.inference.types import MAX_WEIGHT_VERSION, GenerationResult, SamplingOptions

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class SamplingParams(_Request):
    """`sampling_params` of /generate. None means the default, as in SGLang."""

    max_new_tokens: StrictInt | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=1.0, ge=0.0)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt | None = -1
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: bool = False
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = Field(default=None, description="alias of sampling_seed")
    skip_special_tokens: bool = True
    n: StrictInt = Field(default=1, ge=1, le=1, description="one sample per request (send n requests)")
    json_schema: str | None = Field(default=None, description="constrain the output to this JSON Schema")
    regex: str | None = Field(default=None, description="constrain the output to this regular expression")
    ebnf: str | None = Field(default=None, description="constrain the output to this grammar (Lark or GBNF)")
    structural_tag: str | None = Field(default=None, description="SGLang's structural tag (not on the native engine)")
    grammar_prefix_tokens: StrictInt | None = Field(
        default=None, ge=0,
        description="our extension: the last N input_ids were already generated under the grammar (a resumed call)",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k_range(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError(f"top_k={value} must be -1 (whole vocabulary) or >= 1")
        return value

    @model_validator(mode="after")
    def _one_seed(self) -> SamplingParams:
        if self.seed is not None and self.sampling_seed is not None and self.seed != self.sampling_seed:
            raise ValueError(f"seed={self.seed} and sampling_seed={self.sampling_seed} disagree: send one")
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are both set: give at most one grammar")
        if self.grammar_prefix_tokens and not given:
            raise ValueError("grammar_prefix_tokens is set without a grammar")
        return self

    def to_options(self) -> SamplingOptions:
        return SamplingOptions(
            max_new_tokens=self.max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            seed=self.sampling_seed if self.sampling_seed is not None else self.seed,
            json_schema=self.json_schema,
            regex=self.regex,
            ebnf=self.ebnf,
            structural_tag=self.structural_tag,
            grammar_prefix_tokens=self.grammar_prefix_tokens or 0,
        )


class GenerateRequest(_Request):
    """POST /generate: one prompt, as token ids (or text, tokenized with the served tokenizer)."""

    rid: str | None = None
    text: str | None = None
    input_ids: list[StrictInt] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: StrictInt | None = Field(
        default=None, description="only -1 (output tokens only) is served: prompt logprobs are not computed"
    )
    top_logprobs_num: StrictInt | None = Field(default=None, description="only 0 is served")
    return_text_in_logprobs: bool = False
    stream: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of input_ids or text")
        if self.logprob_start_len not in (None, -1):
            raise ValueError(f"logprob_start_len={self.logprob_start_len}: only -1 is supported")
        if self.top_logprobs_num not in (None, 0):
            raise ValueError(f"top_logprobs_num={self.top_logprobs_num}: only 0 is supported")
        return self


class MetaInfo(_Response):
    id: str
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    e2e_latency: float | None = None
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    output_token_versions: list[int] | None = None


class GenerateResponse(_Response):
    text: str = ""
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo

    @property
    def finish_type(self) -> str | None:
        return None if self.meta_info.finish_reason is None else self.meta_info.finish_reason.get("type")

    def token_logprobs(self) -> list[float]:
        return [lp for lp, _, _ in self.meta_info.output_token_logprobs or []]

    def token_versions(self) -> list[int]:
        """Per-token versions; from weight_version when the server (SGLang) does not send them (-1 if
        that is not an integer)."""
        if self.meta_info.output_token_versions is not None:
            return self.meta_info.output_token_versions
        try:
            version = int(self.meta_info.weight_version or "")
        except ValueError:
            version = -1
        return [version] * len(self.output_ids)


def generate_response(
    result: GenerationResult, *, return_logprob: bool, text: str = "", token_texts: list[str] | None = None
) -> GenerateResponse:
    """The /generate body for a finished (or, when streaming, partial) engine result."""
    logprobs = None
    if return_logprob:
        texts: list[str | None] = list(token_texts) if token_texts is not None else [None] * len(result.output_ids)
        logprobs = [
            (lp, tok, txt) for lp, tok, txt in zip(result.output_logprobs, result.output_ids, texts, strict=True)
        ]
    return GenerateResponse(
        text=text,
        output_ids=result.output_ids,
        meta_info=MetaInfo(
            id=result.rid,
            finish_reason=None if result.finish_reason is None else result.finish_reason.to_json(),
            prompt_tokens=len(result.prompt_ids),
            completion_tokens=len(result.output_ids),
            cached_tokens=result.cached_tokens,
            weight_version=str(result.weight_version),
            e2e_latency=result.e2e_latency_s,
            output_token_logprobs=logprobs,
            output_token_versions=result.output_versions,
        ),
    )


class PauseGenerationRequest(_Request):
    """POST /pause_generation. SGLang's default mode is abort."""

    mode: Literal["abort", "in_place", "retract"] = "abort"


class ContinueGenerationRequest(_Request):
    torch_empty_cache: bool = Field(default=True, description="accepted for SGLang compatibility; no-op")


class ControlResponse(_Response):
    message: str
    status: str = "ok"
    num_requests: int | None = None


class AbortRequest(_Request):
    """POST /abort_request: one request by rid, or all of them."""

    rid: str = ""
    abort_all: bool = False


class AbortResponse(_Response):
    num_aborted: int


class UpdateWeightsFromDiskRequest(_Request):
    model_path: str = Field(min_length=1)
    load_format: Literal["auto", "safetensors"] | None = None
    abort_all_requests: bool = False
    weight_version: str | StrictInt | None = Field(
        default=None, description="integer policy version (SGLang sends strings); None = current + 1"
    )
    flush_cache: bool = Field(default=True, description="accepted; the engine always drops stale KV")
    keep_pause: bool = Field(default=False, description="stay paused (in_place) after the swap")
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-fA-F]{64}$",
        description="our extension: hex SHA-256 of the checkpoint's *.safetensors bytes in name order; "
        "a mismatch refuses the load",
    )
    torch_empty_cache: bool = Field(default=False, description="accepted for SGLang compatibility; no-op")

    @field_validator("weight_version")
    @classmethod
    def _integer_version(cls, value: str | int | None) -> str | int | None:
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError as e:
            raise ValueError(f"weight_version={str(value)[:40]!r} is not an integer policy version") from e
        if not 0 <= number <= MAX_WEIGHT_VERSION:
            raise ValueError(f"weight_version={str(value)[:40]!r} must be in [0, 2**63)")
        return number

    def version(self) -> int | None:
        return None if self.weight_version is None else int(self.weight_version)


class UpdateWeightsFromDiskResponse(_Response):
    success: bool
    message: str
    num_paused_requests: int = 0
    weight_version: str | None = None
    load_ms: float | None = None
    apply_ms: float | None = None


class WeightVersionResponse(_Response):
    weight_version: str


class ModelInfoResponse(_Response):
    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None
    model_type: str | None = None
    architectures: list[str] | None = None
    vocab_size: int | None = None
    context_length: int | None = None
    resource_id: str | None = None
    engine: str | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    """OpenAI / SGLang error envelope: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorDetail

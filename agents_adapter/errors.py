"""Errors of the `agents_adapter` package; third-party errors are converted at the boundary."""


class AdapterError(Exception):
    """Root of the package."""


class ConfigError(AdapterError, ValueError):
    """A configuration field has a bad value (the message names the field and the value)."""


class TreeError(AdapterError):
    """A session's prefix tree was asked to do something that would make it inconsistent."""


class RejectedCallError(TreeError):
    """An LLM call cannot be merged into its session's tree; the tree is left unchanged.

    The Faust shell sends such a call to the dead-letter topic with this message as the reason.
    """


class MalformedCallError(RejectedCallError):
    """The call's packed fields disagree (e.g. fewer logprobs than output tokens) or overflow int32."""


class ConflictingCallError(RejectedCallError):
    """A call id already in the tree arrived again with different tokens, logprobs or versions."""


class LateCallError(RejectedCallError):
    """A call arrived for a closed session and is not in its trajectory (a redelivered call that is,
    is a duplicate, not late): the shell dead-letters it, so it is kept for an operator, never lost."""


class UnresolvedCallError(RejectedCallError):
    """A call recorded by reference (`schemas.prompt_refs`) names a base call its session's tree does not hold
    (or holds fewer ids of than the reference takes): dead-lettered with that reason, never guessed."""


class UnknownCallError(TreeError, KeyError):
    """The call id was never inserted into this tree."""


class InvalidNodesError(TreeError):
    """Nodes (from a Trajectory event or a delta) do not describe a valid prefix tree."""


class DeltaError(TreeError):
    """A tree delta cannot be decoded, or does not follow the state it is applied to."""


# --- capture proxy (HTTP-facing errors: each carries the status and OpenAI error fields it maps to) ----


class ProxyError(AdapterError):
    """A call the capture proxy could not serve; `asgi.error_response` turns it into an HTTP error.

    status_code / error_type / code follow the OpenAI error body ({"error": {"message", "type",
    "param", "code"}}); `param` names the offending request field when there is one.
    """

    status_code = 500
    error_type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    @property
    def headers(self) -> dict[str, str]:
        """Extra response headers (e.g. Retry-After)."""
        return {}


class AuthenticationError(ProxyError):
    """No API key, or one that maps to no agent (or not to the admin)."""

    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class SessionForbiddenError(ProxyError):
    """The session belongs to another agent."""

    status_code = 403
    error_type = "permission_error"
    code = "session_forbidden"


class UnknownModelError(ProxyError):
    """The request names a model this proxy does not serve."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class UnknownSessionError(ProxyError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "session_not_found"


class UnknownResponseError(ProxyError):
    """A `previous_response_id` that this proxy does not keep (never served, not stored, forgotten, or
    another agent's: not told apart, so one agent cannot probe another's ids)."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "previous_response_not_found"


class SessionClosedError(ProxyError):
    """The session already ended (or already has its reward): no more calls or rewards."""

    status_code = 409
    error_type = "invalid_request_error"
    code = "session_closed"


class InvalidParameterError(ProxyError):
    """A request field has a value the proxy cannot serve (out of range, unsupported option)."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_parameter"


class MalformedRequestError(ProxyError):
    """The body is not JSON (FastAPI's convention: 422 Unprocessable Entity)."""

    status_code = 422
    error_type = "invalid_request_error"
    code = "malformed_json"


class InvalidBodyError(InvalidParameterError):
    """The body cannot be read safely: not UTF-8, nested deeper than max_json_depth, a lone surrogate,
    a number out of range. Refused before any model sees it, so no parser, tokenizer or encoder
    downstream can fail on it (they used to: RecursionError, OverflowError, a reset connection)."""

    code = "invalid_body"


class PayloadTooLargeError(ProxyError):
    """The body is larger than max_body_bytes (it is not read further)."""

    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class RateLimitedError(ProxyError):
    """The agent already has max_inflight_per_agent requests in flight; retry after `retry_after_s`."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class PromptTooLongError(InvalidParameterError):
    """The prompt (after templating) is longer than max_prompt_tokens or leaves no room to generate."""

    code = "context_length_exceeded"


class EngineRejectedError(InvalidParameterError):
    """The inference engine refused the request as invalid (4xx); retrying elsewhere would not help."""

    code = "engine_rejected"


class ServiceUnavailableError(ProxyError):
    """The call cannot be served now; the agent may retry it."""

    status_code = 503
    error_type = "service_unavailable"
    code = "service_unavailable"


class NoRolloutResourceError(ServiceUnavailableError):
    """No rollout resource became available (all paused, preempted or lost) before the deadline."""

    code = "no_rollout_resource"


class LongRequestTimeoutError(ServiceUnavailableError):
    """The call did not finish within long_request_timeout_s; nothing was served."""

    code = "long_request_timeout"


class EngineFailedError(ServiceUnavailableError):
    """Every engine attempt failed (max_segments reached, or an engine broke the protocol)."""

    code = "engine_failed"


class RecordingError(ServiceUnavailableError):
    """Kafka did not acknowledge the call's events in time: the call is refused rather than served unrecorded."""

    code = "recording_unavailable"


class DrainingError(ServiceUnavailableError):
    """The proxy is draining (admin) and takes no new calls."""

    code = "draining"


class TemplateError(ConfigError):
    """The model's chat template cannot be split into prefix + reply + suffix (no token-in/token-out)."""

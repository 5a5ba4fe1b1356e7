"""Errors of the `inference_svc` package.

Each error carries an HTTP status (and, where it needs them, response `headers`) so the app maps every
failure to a response in one place (`inference_svc.http_errors.error_response`, over `bus.http.http_error`);
third-party errors are converted at the boundary with `raise ... from e`.
"""


class InferenceError(Exception):
    """Root of the package.

    `expose_message` says whether the message may go back to a caller: the root class also wraps
    third-party failures (whose text can name files, code or internal state), so a bare
    `InferenceError` is answered with a generic message and logged; each subclass writes its own text.
    """

    status_code = 500
    error_type = "internal_error"
    expose_message = False


class InvalidRequestError(InferenceError):
    """The caller sent something the engine cannot serve (bad token id, context overflow, ...)."""

    status_code = 400
    error_type = "invalid_request_error"
    expose_message = True


class PayloadTooLargeError(InvalidRequestError):
    """The request body is larger than `max_body_bytes`."""

    status_code = 413


class UnauthorizedError(InferenceError):
    """A control endpoint was called without the control key (see `InferenceConfig.control_key`)."""

    status_code = 401
    error_type = "authentication_error"
    expose_message = True

    @property
    def headers(self) -> dict[str, str]:
        """RFC 6750: a 401 names the scheme the caller should use."""
        return {"WWW-Authenticate": "Bearer"}


class WeightLoadError(InferenceError):
    """A checkpoint could not be read or does not fit the served model; the old weights stay live."""

    status_code = 400
    error_type = "weight_load_error"
    expose_message = True


class WeightsAccessError(WeightLoadError):
    """A checkpoint path outside the configured weights root(s) (traversal or a symlink escaping it)."""

    status_code = 403
    error_type = "weights_path_forbidden"


class UnsupportedModelError(InferenceError):
    """The native engine cannot run this architecture (use the SGLang backend on a GPU)."""

    status_code = 400
    error_type = "unsupported_model_error"
    expose_message = True


class EngineClosedError(InferenceError):
    """The engine was shut down (or its loop died) before the request finished."""

    status_code = 503
    error_type = "service_unavailable"
    expose_message = True


class BackendUnavailableError(InferenceError):
    """An optional backend (SGLang, CUDA) is not installed or did not come up."""

    status_code = 503
    error_type = "service_unavailable"
    expose_message = True


class InferenceHTTPError(InferenceError):
    """An inference server answered with an error status; `status_code` is the server's."""

    def __init__(self, status_code: int, error_type: str, message: str) -> None:
        super().__init__(f"HTTP {status_code} {error_type}: {message}")
        self.expose_message = True
        self.status_code = status_code
        self.error_type = error_type
        self.message = message

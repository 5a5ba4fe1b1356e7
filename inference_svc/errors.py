"""Errors of the `inference_svc` package.

Each error carries an HTTP status so the app maps every failure to a response in one place
(`app.error_response`); third-party errors are converted at the boundary with `raise ... from e`.
"""


class InferenceError(Exception):
    """Root of the package."""

    status_code = 500
    error_type = "internal_error"


class InvalidRequestError(InferenceError):
    """The caller sent something the engine cannot serve (bad token id, context overflow, ...)."""

    status_code = 400
    error_type = "invalid_request_error"


class WeightLoadError(InferenceError):
    """A checkpoint could not be read or does not fit the served model; the old weights stay live."""

    status_code = 400
    error_type = "weight_load_error"


class UnsupportedModelError(InferenceError):
    """The native engine cannot run this architecture (use the SGLang backend on a GPU)."""

    status_code = 400
    error_type = "unsupported_model_error"


class EngineClosedError(InferenceError):
    """The engine was shut down (or its loop died) before the request finished."""

    status_code = 503
    error_type = "service_unavailable"


class BackendUnavailableError(InferenceError):
    """An optional backend (SGLang, CUDA) is not installed or did not come up."""

    status_code = 503
    error_type = "service_unavailable"


class InferenceHTTPError(InferenceError):
    """An inference server answered with an error status; `status_code` is the server's."""

    def __init__(self, status_code: int, error_type: str, message: str) -> None:
        super().__init__(f"HTTP {status_code} {error_type}: {message}")
        self.status_code = status_code
        self.error_type = error_type
        self.message = message

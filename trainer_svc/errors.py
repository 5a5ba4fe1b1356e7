"""Errors of the `trainer_svc` package; third-party errors (DeepSpeed, torch, safetensors) are converted
at the boundary with `raise ... from e`, so the service shell catches `TrainerError` only."""


class TrainerError(Exception):
    """Root of the package."""


class ConfigError(TrainerError, ValueError):
    """A configuration field has a bad value (the message names the field and the value)."""


class TreePackError(TrainerError):
    """A trajectory's node list is not a valid prefix tree (bad parent, ragged per-token arrays)."""


class EngineError(TrainerError):
    """DeepSpeed could not be set up or failed during a step."""


class CheckpointError(TrainerError):
    """A checkpoint could not be written, or one being read is incomplete or does not fit the model."""


class BatchError(TrainerError):
    """A train step was given data it cannot learn from (wrong policy version, no trajectories)."""


class NonFiniteError(BatchError):
    """A step refused because a reward, the loss, a gradient or an updated weight is not finite (or a reward
    is beyond `algorithm.max_abs_reward`). `weights_changed` is False when it was raised before any
    optimizer update of the step; True when earlier updates of the step were applied (then the caller must
    restore the weights of the last checkpoint before it trains again or publishes anything)."""

    def __init__(self, message: str, *, weights_changed: bool = False) -> None:
        super().__init__(message)
        self.weights_changed = weights_changed

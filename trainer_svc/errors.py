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

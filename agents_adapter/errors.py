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


class UnknownCallError(TreeError, KeyError):
    """The call id was never inserted into this tree."""


class InvalidNodesError(TreeError):
    """Nodes (from a Trajectory event or a delta) do not describe a valid prefix tree."""


class DeltaError(TreeError):
    """A tree delta cannot be decoded, or does not follow the state it is applied to."""

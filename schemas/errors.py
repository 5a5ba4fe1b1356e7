"""Errors of the `schemas` package: every failure to encode or decode an event is a `SchemaError`."""


class SchemaError(Exception):
    """Root of the package: callers catch this one to handle any encoding or decoding problem."""


class EncodeError(SchemaError):
    """An event could not be written with its schema (a value of the wrong type or range)."""


class DecodeError(SchemaError):
    """Bytes could not be read back as an event."""


class BadMagicError(DecodeError):
    """The message does not start with the single-object marker C3 01."""


class TruncatedMessageError(DecodeError):
    """The message ends before its header or body does."""


class UnknownFingerprintError(DecodeError):
    """The message names a writer schema the registry has never seen."""


class SchemaDefinitionError(SchemaError):
    """An .avsc file is invalid or breaks the evolution rule."""


class PayloadError(SchemaError):
    """A JSON payload carried inside an event (`schemas.payloads`) is malformed; the message names the field."""

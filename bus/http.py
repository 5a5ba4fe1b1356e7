"""The request-body guard and the exception → HTTP error mapping that every HTTP service shares.

Why: a JSON body is parsed by code that was not written for hostile input. Python's `json` recurses
(a body 100,000 arrays deep raises RecursionError, or worse, exhausts the stack in a later walk), a
lone UTF-16 surrogate (`"\\ud800"`) parses fine but cannot be encoded back to UTF-8 in a log line, a
tokenizer or a response, and an integer past int64 or a float that overflows to inf breaks the first
numeric library it reaches. So a service refuses such a body before any route sees it, each refusal a
4xx naming the problem and where it is. The capture proxy and the inference service share this one
version; it imports no web framework at module level (the FastAPI/Starlette exception types are
imported inside `http_error`), so it is testable as plain functions.

API:
- `refuse_declared_size(content_length, max_bytes)`: raises `BodyTooLarge` when a Content-Length header
  already says the body is over the limit (so the body is never read).
- `await read_capped(chunks, max_bytes) -> bytes`: joins an async iterable of chunks, raising
  `BodyTooLarge` as soon as they pass the limit (the rest is not read).
- `parse_json_body(raw, max_depth, *, strict_numbers=False) -> Any`: the parsed body, after checking
  UTF-8, depth (an array or object is one level, the top-level one counting 1; walked without
  recursion), lone surrogates in keys and strings, and with `strict_numbers` integers within int64,
  finite floats and no NaN/Infinity constants. Raises a `BodyRefused` subclass; it does not require an
  object at the top (that is the caller's schema). An empty body is malformed: pass `raw or b"{}"` where
  an empty body means "no fields".
- `BodyRefused` (a `BusError`, with `status_code`, `error_type`, `code`, `param`): `BodyTooLarge` (413),
  `BodyNotUtf8`, `BodyTooDeep`, `LoneSurrogate`, `NumberOutOfRange` (400), `MalformedJson` (422). A
  service converts them to its own errors at its boundary, or lets `http_error` map them as they are.
- `http_error(exc, *, log_name) -> HttpError`: the status, OpenAI-style error fields and headers for
  any exception: a service's own errors by their `status_code`/`error_type` (and optional `param`,
  `code`, `headers`, `expose_message`) attributes, FastAPI's request validation errors as 400, Starlette's
  HTTP exceptions by their status, anything else 500. A 5xx never carries an exception's text: the
  message gives an error id and says `log_name` (e.g. "the proxy's log") has the rest.
- `describe_validation_errors(errors) -> (message, param)`: pydantic's error list as one message naming
  each field and what it got, and the first field's path.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus.errors import BusError

logger = logging.getLogger(__name__)
_INT64 = 2**63
_WHERE_MAX = 120  # a path quoted in a message is cut here: a hostile body must not make the message huge


class BodyRefused(BusError, ValueError):
    """A request body refused before parsing or validation; the message names the problem and where."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_body"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BodyTooLarge(BodyRefused):
    """Over the service's `max_body_bytes`."""

    status_code = 413
    code = "payload_too_large"


class BodyNotUtf8(BodyRefused):
    """The bytes do not decode as UTF-8 (RFC 8259 requires it)."""


class BodyTooDeep(BodyRefused):
    """Arrays/objects nested deeper than the service's `max_json_depth`."""


class LoneSurrogate(BodyRefused):
    """A key or string holds an unpaired UTF-16 surrogate escape: not a Unicode character."""


class NumberOutOfRange(BodyRefused):
    """An integer outside int64 or a float that overflows to infinity (with `strict_numbers`)."""


class MalformedJson(BodyRefused):
    """Not JSON at all (or, with `strict_numbers`, a NaN/Infinity constant, which RFC 8259 does not allow)."""

    status_code = 422
    code = "malformed_json"


def refuse_declared_size(content_length: str | bytes | None, max_bytes: int) -> None:
    """Refuses a body whose declared Content-Length is over `max_bytes`, before a byte of it is read."""
    declared = content_length.decode("latin-1") if isinstance(content_length, bytes) else content_length or ""
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"the body has {declared} bytes; at most max_body_bytes={max_bytes} are accepted")


async def read_capped(chunks: AsyncIterable[bytes], max_bytes: int) -> bytes:
    """The whole body, refused as soon as it is known to be over `max_bytes` (the rest is left unread)."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"the body is over max_body_bytes={max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number (RFC 8259)")


def parse_json_body(raw: bytes, max_depth: int, *, strict_numbers: bool = False) -> Any:
    """The parsed body, refused (a `BodyRefused`) if any later step could not handle it (module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyNotUtf8(
            f"the body is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} ({e.reason})"
        ) from e
    try:
        data = json.loads(text, parse_constant=_not_a_number) if strict_numbers else json.loads(text)
    except RecursionError as e:
        raise BodyTooDeep(f"the body nests deeper than max_json_depth={max_depth}") from e
    except ValueError as e:
        raise MalformedJson(f"malformed JSON body: {e}") from e
    check_json_tree(data, max_depth, strict_numbers=strict_numbers, texts=_SURROGATE_ESCAPE.search(text) is not None)
    return data


# A lone surrogate can reach a parsed string only through a \uD800-\uDFFF escape (the body decoded as strict
# UTF-8 holds none): a body without one needs no per-string check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _certainly_fits(root: Any, max_depth: int, strict_numbers: bool, texts: bool) -> bool:
    """The walk of the common case, level by level, building no path strings (they were most of a chat
    request's check): True when nothing in the tree can fail a check; False sends it to the walk that names
    the fault. Strings, a body's commonest value, are tested first."""
    level: list[Any] = [root]
    depth = 1
    while level:
        if depth > max_depth:
            return False
        below: list[Any] = []
        for node in level:
            if type(node) is dict:
                if texts and not all(k.isascii() for k in node):
                    return False
                values = node.values()
            else:
                values = node
            for value in values:
                kind = type(value)
                if kind is str:
                    if texts and not value.isascii():
                        return False
                elif kind is dict or kind is list:
                    below.append(value)
                elif strict_numbers and ((kind is int and not -_INT64 <= value < _INT64)
                                         or (kind is float and not math.isfinite(value))):
                    return False
        level, depth = below, depth + 1
    return True


def check_json_tree(root: Any, max_depth: int, *, strict_numbers: bool = False, texts: bool = True) -> None:
    """Walks a parsed body without recursion (a deep body must not exhaust the stack here either).
    `texts=False`: no string can hold a lone surrogate (see `_SURROGATE_ESCAPE`), only depth and numbers
    are checked."""
    if isinstance(root, dict | list) and _certainly_fits(root, max_depth, strict_numbers, texts):
        return
    if isinstance(root, str):
        _check_text(root, "body")
    if not isinstance(root, dict | list):
        _check_number(root, "body", strict_numbers)
        return
    stack: list[tuple[dict[str, Any] | list[Any], str, int]] = [(root, "body", 1)]
    while stack:
        node, where, depth = stack.pop()
        if depth > max_depth:
            raise BodyTooDeep(f"the body nests deeper than max_json_depth={max_depth} (at {where[:_WHERE_MAX]})")
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(key, str):
                _check_text(key, f"a key in {where}")
            path = f"{where}.{key}"
            if isinstance(value, dict | list):
                stack.append((value, path, depth + 1))
            elif isinstance(value, str):
                _check_text(value, path)
            else:
                _check_number(value, path, strict_numbers)


def _check_text(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LoneSurrogate(
            f"{where[:_WHERE_MAX]}: lone surrogate {text[e.start]!a} at character {e.start} "
            "(a lone UTF-16 surrogate is not a Unicode character: strings must be valid Unicode)"
        ) from e


def _check_number(value: Any, where: str, strict: bool) -> None:
    if not strict or isinstance(value, bool):
        return
    param = where.removeprefix("body.")[:_WHERE_MAX]
    if isinstance(value, int) and not -_INT64 <= value < _INT64:
        raise NumberOutOfRange(f"{where[:_WHERE_MAX]}: the integer {value} is outside the 64-bit range", param=param)
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberOutOfRange(
            f"{where[:_WHERE_MAX]}: the number is too large (it overflows to {value})", param=param
        )


# ------------------------------------------------------------------------- exception -> HTTP error


@dataclass(frozen=True)
class HttpError:
    """What an error response says: its status, the OpenAI error body fields and extra headers."""

    status: int
    error_type: str
    message: str
    param: str | None = None
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def http_error(exc: BaseException, *, log_name: str) -> HttpError:
    """The one mapping from an exception to an HTTP error (see the module docstring)."""
    from fastapi.exceptions import RequestValidationError  # web framework types only where a web app maps errors
    from starlette.exceptions import HTTPException

    status, error_type = getattr(exc, "status_code", None), getattr(exc, "error_type", None)
    if isinstance(status, int) and isinstance(error_type, str):
        exposed = getattr(exc, "expose_message", True)
        message = str(exc) if exposed else internal_message(exc, log_name)
        return HttpError(status, error_type, message, getattr(exc, "param", None), getattr(exc, "code", None),
                         dict(getattr(exc, "headers", None) or {}))
    if isinstance(exc, RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        return HttpError(400, "invalid_request_error", message, param, "invalid_parameter")
    if isinstance(exc, HTTPException):
        return HttpError(exc.status_code, "invalid_request_error", str(exc.detail),
                         code="not_found" if exc.status_code == 404 else None)
    return HttpError(500, "internal_error", internal_message(exc, log_name))


def internal_message(exc: BaseException, log_name: str) -> str:
    """What a caller may read of an unexpected failure: an id into the log, which has the exception."""
    error_id = uuid.uuid4().hex[:12]
    logger.error("internal error %s: %r", error_id, exc, exc_info=exc, extra={"error_id": error_id})
    return f"internal error (id {error_id}): {log_name} has the details"


def describe_validation_errors(errors: Any) -> tuple[str, str | None]:
    """pydantic's errors as one message (each field, the problem, what it got) and the first field's path."""
    if any(err.get("type") == "json_invalid" for err in errors):
        return "malformed JSON body: " + "; ".join(str(err.get("ctx", {}).get("error", "")) for err in errors), None
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')} (got {repr(err.get('input'))[:80]})")
    first = ".".join(str(p) for p in errors[0].get("loc", ()) if p != "body") if errors else ""
    return "; ".join(parts) or "invalid request", first or None

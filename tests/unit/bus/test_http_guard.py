"""The shared body guard and error mapping (bus/http.py) as plain functions: no app, no server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import given
from hypothesis import strategies as st
from starlette.exceptions import HTTPException

from bus.errors import BusError
from bus.http import (
    BodyNotUtf8,
    BodyRefused,
    BodyTooDeep,
    BodyTooLarge,
    LoneSurrogate,
    MalformedJson,
    NumberOutOfRange,
    http_error,
    parse_json_body,
    read_capped,
    refuse_declared_size,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("raw", "error", "words"), [
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", BodyTooDeep, "nests deeper than max_json_depth=8"),
    (b'{"a": ' + b"[" * 8 + b"]" * 8 + b"}", BodyTooDeep, "max_json_depth=8 (at body.a.0.0.0.0.0.0.0)"),
    (b'{"m": [{"c": "\\ud800"}]}', LoneSurrogate, "body.m.0.c: lone surrogate '\\ud800' at character 0"),
    (b'{"m": {"\\udfff": 1}}', LoneSurrogate, "a key in body.m: lone surrogate '\\udfff'"),
    (b'"x\\ud800"', LoneSurrogate, "body: lone surrogate '\\ud800' at character 1"),
    (b'{"content": "caf\xe9"}', BodyNotUtf8, "not valid UTF-8: byte 0xe9 at offset 16"),
    (b'{"a": [1,', MalformedJson, "malformed JSON body: "),
    (b"", MalformedJson, "malformed JSON body: "),
])
def test_unsafe_bodies_are_refused_naming_the_problem(raw: bytes, error: type[BodyRefused], words: str) -> None:
    with pytest.raises(error) as refused:
        parse_json_body(raw, max_depth=8)
    assert words in str(refused.value)
    assert isinstance(refused.value, BusError) and 400 <= refused.value.status_code < 500


@pytest.mark.parametrize(("raw", "error", "words", "param"), [
    (b'{"ids": [9223372036854775808]}', NumberOutOfRange, "body.ids.0: the integer 9223372036854775808", "ids.0"),
    (b'{"ids": [-9223372036854775809]}', NumberOutOfRange, "outside the 64-bit range", "ids.0"),
    (b'{"t": 1e400}', NumberOutOfRange, "body.t: the number is too large (it overflows to inf)", "t"),
    (b'{"r": NaN}', MalformedJson, "NaN is not a JSON number", None),
    (b'{"r": -Infinity}', MalformedJson, "-Infinity is not a JSON number", None),
])
def test_strict_numbers_refuse_what_int64_and_floats_cannot_hold(
    raw: bytes, error: type[BodyRefused], words: str, param: str | None
) -> None:
    with pytest.raises(error) as refused:
        parse_json_body(raw, max_depth=8, strict_numbers=True)
    assert words in str(refused.value) and refused.value.param == param
    assert parse_json_body(raw.replace(b"-Infinity", b"-1e400"), max_depth=8) is not None  # lenient by default


def test_depth_counts_arrays_and_objects_the_top_level_one_as_1() -> None:
    assert parse_json_body(b"[[[]]]", max_depth=3) == [[[]]]
    with pytest.raises(BodyTooDeep):
        parse_json_body(b"[[[[]]]]", max_depth=3)
    assert parse_json_body(b'{"a": {"b": 1}}', max_depth=2) == {"a": {"b": 1}}
    assert parse_json_body(b"7", max_depth=1) == 7


@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(), lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=20,
))
def test_safe_bodies_pass_unchanged(body: object) -> None:
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert parse_json_body(raw, max_depth=64, strict_numbers=True) == body


def test_a_declared_size_over_the_limit_is_refused_before_reading() -> None:
    for declared in ("2048", b"2048"):
        with pytest.raises(BodyTooLarge, match="2048 bytes; at most max_body_bytes=1024"):
            refuse_declared_size(declared, 1024)
    for fine in ("1024", b"", None, "garbage"):
        refuse_declared_size(fine, 1024)


def test_reading_stops_at_the_first_chunk_over_the_limit() -> None:
    read: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(10):
            read.append(i)
            yield b"x" * 400

    with pytest.raises(BodyTooLarge, match="over max_body_bytes=1000"):
        asyncio.run(read_capped(chunks(), 1000))
    assert read == [0, 1, 2]
    assert asyncio.run(read_capped(chunks(), 4000)) == b"x" * 4000


class _OwnError(Exception):
    status_code = 409
    error_type = "conflict"
    code = "session_ended"
    param = "session"
    headers = {"Retry-After": "1"}


class _Hidden(_OwnError):
    status_code = 500
    expose_message = False


def test_errors_map_to_status_and_fields() -> None:
    own = http_error(_OwnError("ended"), log_name="the test log")
    assert (own.status, own.error_type, own.message, own.param, own.code, dict(own.headers)) == (
        409, "conflict", "ended", "session", "session_ended", {"Retry-After": "1"})
    too_large = http_error(BodyTooLarge("big"), log_name="the test log")
    assert (too_large.status, too_large.code) == (413, "payload_too_large")
    missing = http_error(HTTPException(404, "Not Found"), log_name="the test log")
    assert (missing.status, missing.error_type, missing.message, missing.code) == (
        404, "invalid_request_error", "Not Found", "not_found")
    invalid = http_error(RequestValidationError([{"loc": ("body", "n"), "msg": "bad", "input": -1}]),
                         log_name="the test log")
    assert (invalid.status, invalid.message, invalid.param) == (400, "n: bad (got -1)", "n")


@pytest.mark.parametrize("exc", [RuntimeError("password=hunter2 at /srv/x.py"), _Hidden("password=hunter2")])
def test_a_5xx_never_echoes_the_exception(exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    error = http_error(exc, log_name="the test log")
    assert error.status == 500 and "hunter2" not in error.message
    assert error.message.startswith("internal error (id ") and error.message.endswith("the test log has the details")
    error_id = error.message.removeprefix("internal error (id ").split(")")[0]
    assert any(error_id in record.getMessage() and "hunter2" in record.getMessage() for record in caplog.records)

"""A keep-alive HTTP/1.1 client for one origin, on an asyncio protocol: the inference client's transport.

Why not aiohttp: the proxy makes one engine request per served call, and aiohttp's request machinery
(session, connector, tracing hooks, request and response objects, a stream reader, a payload writer) was
its costliest single part, ~0.8 ms of CPU per call (bench/adapter_bench.py's profile; docs/architecture.md,
"The hot path, as built"). The engines speak plain HTTP/1.1 JSON (the native app, SGLang: uvicorn both), so what is
needed is small: a request written in one `write`, a response read into one buffer (Content-Length,
chunked, or up to the close), and a pool of idle connections reused for `keepalive_s`.

Semantics kept from the aiohttp client it replaces: at most `max_connections` requests in flight (the
others wait for a connection), a total `timeout_s` per request (`TimeoutError`), idle connections dropped
before the servers' own keep-alive (uvicorn's 5 s) would close them under a request, no retry of a
request whose connection failed (the caller decides: `InferenceClient` maps it to a connection error).
A request cancelled or failed mid-way closes its connection: its state is unknown, it is never reused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import cast
from urllib.parse import urlsplit

_MAX_HEAD_BYTES = 64 * 1024


class HttpProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.1 this client understands, or the connection ended under it."""


class _Response:
    """The parse of one response out of a connection's buffer."""

    __slots__ = ("body_start", "chunked", "keep_alive", "length", "status")

    def __init__(self, head: bytes, body_start: int) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.keep_alive = parts[0] == b"HTTP/1.1"
        self.body_start = body_start
        self.length: int | None = None
        self.chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                if not value.isdigit():
                    raise HttpProtocolError(f"bad Content-Length: {value[:40]!r}")
                self.length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = value.endswith(b"chunked")
            elif name == b"connection":
                self.keep_alive = b"close" not in value if self.keep_alive else b"keep-alive" in value
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.length, self.chunked = 0, False


def _dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """The body of a chunked message starting at `start` and where it ends; None while incomplete."""
    parts: list[bytes] = []
    at = start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size_text = bytes(buffer[at:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpProtocolError(f"bad chunk size: {size_text[:40]!r}") from None
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)
            return (b"".join(parts), trailer_end + 4) if trailer_end >= 0 else None
        if len(buffer) < at + size + 2:
            return None
        parts.append(bytes(buffer[at : at + size]))
        at += size + 2


class _Connection(asyncio.Protocol):
    """One TCP connection: one request at a time, its response collected into `_buffer`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._response: _Response | None = None
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._closed = False
        self._eof = False

    @property
    def usable(self) -> bool:
        return not self._closed and not self._eof and self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of asyncio's

    def send(self, data: bytes, waiter: asyncio.Future[tuple[int, bytes]]) -> None:
        assert self.transport is not None
        self._waiter, self._response = waiter, None
        self._buffer.clear()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is not None and not self._waiter.done():
            try:
                self._deliver()
            except HttpProtocolError as e:
                self._fail(e)

    def _deliver(self, at_eof: bool = False) -> None:
        """Hands the response to the waiter once it is complete."""
        buffer = self._buffer
        while self._response is None:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise HttpProtocolError(f"response head over {_MAX_HEAD_BYTES} bytes")
                return
            response = _Response(bytes(buffer[:head_end]), head_end + 4)
            if 100 <= response.status < 200:  # an interim answer: the real one follows
                del buffer[: head_end + 4]
                continue
            self._response = response
        response = self._response
        if response.chunked:
            parsed = _dechunk(buffer, response.body_start)
            if parsed is None:
                return
            body, end = parsed
        elif response.length is not None:
            end = response.body_start + response.length
            if len(buffer) < end:
                return
            body = bytes(buffer[response.body_start : end])
        elif at_eof:  # neither length nor chunks: the body runs to the close
            end = len(buffer)
            body = bytes(buffer[response.body_start :])
            response.keep_alive = False
        else:
            return
        if end != len(buffer):
            response.keep_alive = False  # bytes nobody asked for: the connection is not reused
        waiter, self._waiter = self._waiter, None
        assert waiter is not None
        if not response.keep_alive:
            self.close()
        waiter.set_result((response.status, body))

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def eof_received(self) -> bool:
        self._eof = True
        if self._waiter is not None and not self._waiter.done():
            try:
                self._deliver(at_eof=True)
            except HttpProtocolError as e:
                self._fail(e)
            if self._waiter is not None:
                self._fail(HttpProtocolError("the server closed the connection before the response ended"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._waiter is not None and not self._waiter.done():
            self._fail(exc if isinstance(exc, OSError) else HttpProtocolError(
                "the connection was closed before the response ended"))

    def close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()


class Http11Client:
    """Requests to the origin of `base_url` (http or https), over a pool of keep-alive connections.

    Bound to the event loop of its first request (as the aiohttp session it replaces was)."""

    def __init__(self, base_url: str, *, headers: dict[str, str], timeout_s: float, max_connections: int,
                 keepalive_s: float) -> None:
        url = urlsplit(base_url)
        # a URL this client cannot reach fails its requests (as a connection error), not its construction
        reachable = url.scheme in ("http", "https") and bool(url.hostname)
        self._unusable = None if reachable else f"not an http(s) URL: {base_url!r}"
        self._host = url.hostname or ""
        try:
            self._port = url.port or (443 if url.scheme == "https" else 80)
        except ValueError as e:
            self._unusable, self._port = f"{base_url!r}: {e}", 0
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        host_header = url.netloc.rsplit("@", 1)[-1]
        self._fixed_head = "".join(f"\r\n{k}: {v}" for k, v in {"Host": host_header, **headers}.items()).encode()
        self._timeout_s = timeout_s
        self._keepalive_s = keepalive_s
        self._idle: deque[_Connection] = deque()
        self._slots: asyncio.Semaphore | None = None
        self._max_connections = max_connections
        self._open: set[_Connection] = set()

    async def request(self, method: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        """(status, body) of one request; raises `OSError` (`HttpProtocolError` among them) or `TimeoutError`."""
        if self._unusable is not None:
            raise HttpProtocolError(self._unusable)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_connections)
        head = f"{method} {self._prefix}{path} HTTP/1.1".encode() + self._fixed_head
        if body is not None:
            head += f"\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}".encode()
        data = head + b"\r\n\r\n" + body if body is not None else head + b"\r\n\r\n"
        async with self._slots, asyncio.timeout(self._timeout_s):
            connection = self._idle_connection() or await self._connect()
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
            try:
                connection.send(data, waiter)
                result = await waiter
            except BaseException:
                connection.close()
                self._open.discard(connection)
                raise
            if connection.usable:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                self._open.discard(connection)
            return result

    def _idle_connection(self) -> _Connection | None:
        """The most recently used idle connection still open and within `keepalive_s`; older ones are closed."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable and now - connection.idle_since < self._keepalive_s:
                self._drop_stale(now)
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    def _drop_stale(self, now: float) -> None:
        while self._idle and not (self._idle[0].usable and now - self._idle[0].idle_since < self._keepalive_s):
            stale = self._idle.popleft()
            stale.close()
            self._open.discard(stale)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(_Connection, self._host, self._port, ssl=self._ssl)
        self._open.add(connection)
        return connection

    async def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

"""The least a capture proxy must do per call, as a server: the floor under `bench/adapter_bench.py`'s
proxy CPU per call.

Per `POST /v1/chat/completions` it does only what no proxy with our guarantees can skip, with the
proxy's own parts: the same server (uvicorn, httptools, uvloop), the body parsed (`json.loads`), one engine
`/generate` over a keep-alive connection (`schemas.inference.http11`, as the proxy), one SQLite (WAL,
synchronous=NORMAL) transaction storing the call before it is published, one Kafka record of the call's size
produced with `acks=all` and idempotence (`bus.producer.EventProducer`, its delivery thread), answered only
once Kafka acknowledged it, and a JSON reply. No template, tokenizer, token-in/token-out, validation,
typed event or session bookkeeping: what the proxy spends above this floor is the cost of those.

`--without PART` (repeatable: `engine`, `store`, `kafka`) leaves that part out, so that what each part costs
is the full floor less the floor without it, and `--without` all three is the server and its JSON alone
(`bench/adapter_bench.py` prints that split under the floor).

The prompt sent to the engine is the messages' text as bytes (ids below 256: the default model has them),
so its length follows the conversation's as the proxy's prompts do; the Kafka record and the stored row are
the request body (about an `LLMCall`'s size for these prompts).

    .venv/bin/python bench/proxy_floor.py --port P --engine http://127.0.0.1:E --bootstrap-servers B --topic T
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import uvicorn  # noqa: E402

from bus.config import BusConfig  # noqa: E402
from bus.errors import PublishError  # noqa: E402
from bus.producer import Delivered, EventProducer  # noqa: E402
from schemas.inference.http11 import Http11Client  # noqa: E402

#: The floor's parts that `--without` can leave out.
PARTS = ("engine", "store", "kafka")


class FloorApp:
    """A raw ASGI callable: every request is served as a chat call (the bench sends nothing else)."""

    def __init__(self, engine_url: str | None, producer: EventProducer | None, topic: str, store: Path | None) -> None:
        """A part given None is left out (`--without`): no engine request, no Kafka record, no store."""
        self.engine_url, self.producer, self.topic = engine_url, producer, topic
        self.db = None if store is None else sqlite3.connect(store, isolation_level=None)
        if self.db is not None:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self.client: Http11Client | None = None  # bound to the server's loop: made on the first request
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await request_body(receive)
        if scope["method"] == "GET":  # the bench's readiness probe
            await answer_json(send, b'{"status":"ok"}')
            return
        request = json.loads(body)
        text = "".join(str(m.get("content") or "") for m in request.get("messages", ()))
        status, output = (200, {"output_ids": []}) if self.engine_url is None else await self._generated(
            self.engine_url, text)
        self.calls += 1
        if self.db is not None:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT INTO calls VALUES (?, ?)", (self.calls, body))
            self.db.execute("COMMIT")
        if self.producer is not None:
            await self._published(self.producer, body)
        await answer_json(send, json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": {
            "role": "assistant", "content": str(output.get("output_ids"))}, "finish_reason": "length"}],
            "engine_status": status}).encode())

    async def _generated(self, engine_url: str, text: str) -> tuple[int, Any]:
        """One engine `/generate` of the text's bytes as ids, over the keep-alive client (as the proxy's)."""
        if self.client is None:
            self.client = Http11Client(engine_url, headers={}, timeout_s=60.0, max_connections=64, keepalive_s=4.0)
        status, answer = await self.client.request("POST", "/generate", orjson.dumps({
            "input_ids": list(text.encode()), "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}))
        return status, json.loads(answer)

    async def _published(self, producer: EventProducer, value: bytes) -> None:
        """Produces the record and returns once Kafka acknowledged it (as `EventProducer.publish_async`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def settle(err: PublishError | None) -> None:
            if future.done():
                return
            if err is not None:
                future.set_exception(err)
            else:
                future.set_result(None)

        def on_delivery(_: Delivered | None, err: PublishError | None) -> None:
            loop.call_soon_threadsafe(settle, err)

        producer.publish_raw(self.topic, str(self.calls).encode(), value, on_delivery)
        await future


async def request_body(receive: Any) -> bytes:
    """A raw ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def answer_json(send: Any, payload: bytes, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True, help="the engine's base URL")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True, help="an existing topic the calls are produced to")
    parser.add_argument("--without", action="append", choices=PARTS, default=[],
                        help="leave this part out (repeatable): what it costs is the full floor less this one")
    args = parser.parse_args()
    producer = None if "kafka" in args.without else EventProducer(
        BusConfig(bootstrap_servers=args.bootstrap_servers), producer_id="proxy-floor")
    with tempfile.TemporaryDirectory(prefix="proxy-floor-") as work:
        app = FloorApp(None if "engine" in args.without else args.engine, producer, args.topic,
                       None if "store" in args.without else Path(work) / "calls.db")
        try:
            uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_keep_alive=30)
        finally:
            if producer is not None:
                producer.close()


if __name__ == "__main__":
    main()

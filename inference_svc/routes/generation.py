"""`/generate`: token-in / token-out generation, whole or streamed (SGLang's native API).

A request is submitted (and so validated) before any response starts, so a bad one is a 400 even when
it asked for a stream. A caller that hangs up no longer holds a slot: a waiting request is aborted when
its connection is gone, a stream when its consumer stops reading.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator
from concurrent.futures import Future
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from inference_svc.engine import NativeEngine
from inference_svc.http_errors import stream_error
from schemas.inference.errors import InferenceError, InvalidRequestError
from schemas.inference.protocol import GenerateRequest, GenerateResponse, generate_response
from schemas.inference.types import GenerationResult

logger = logging.getLogger(__name__)
DISCONNECT_POLL_S = 0.5


class Generation:
    """What the route needs besides the request: the engine, and the tokenizer for `text` in and out."""

    def __init__(self, engine: NativeEngine, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer

    def render(self, result: GenerationResult, req: GenerateRequest) -> GenerateResponse:
        tokenizer = self.tokenizer
        skip = req.sampling_params.skip_special_tokens
        text = tokenizer.decode(result.output_ids, skip_special_tokens=skip) if tokenizer else ""
        token_texts = (
            [tokenizer.decode([t]) for t in result.output_ids]
            if tokenizer is not None and req.return_logprob and req.return_text_in_logprobs
            else None
        )
        return generate_response(result, return_logprob=req.return_logprob, text=text, token_texts=token_texts)

    async def prompt_ids(self, req: GenerateRequest) -> list[int]:
        if req.input_ids is not None:
            return req.input_ids
        if self.tokenizer is None:
            raise InvalidRequestError("this model directory has no tokenizer: send input_ids instead of text")
        try:  # off the event loop: a long text must not stall every other request
            return list(await asyncio.to_thread(self.tokenizer.encode, req.text, add_special_tokens=False))
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"text cannot be tokenized: {type(e).__name__}") from e

    async def whole(self, req: GenerateRequest, ids: list[int], rid: str, request: Request) -> dict[str, Any]:
        pending = asyncio.wrap_future(self.engine.submit(ids, req.sampling_params.to_options(), rid=rid))
        while not pending.done():  # a caller that hung up no longer holds a slot
            await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
            if not pending.done() and await request.is_disconnected():
                await asyncio.to_thread(self.engine.abort, rid)
                logger.info("caller disconnected: request aborted", extra={"rid": rid})
        return self.render(pending.result(), req).model_dump()

    def streamed(self, req: GenerateRequest, ids: list[int], rid: str) -> StreamingResponse:
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[GenerationResult] = asyncio.Queue()
        future = self.engine.submit(
            ids, req.sampling_params.to_options(), rid=rid,
            listener=lambda snap: loop.call_soon_threadsafe(updates.put_nowait, snap),
        )
        return StreamingResponse(self.events(req, rid, future, updates), media_type="text/event-stream")

    async def events(
        self, req: GenerateRequest, rid: str, future: Future[GenerationResult], updates: asyncio.Queue[GenerationResult]
    ) -> AsyncGenerator[bytes]:
        done = asyncio.wrap_future(future)
        try:
            while not done.done():
                getter = asyncio.ensure_future(updates.get())
                await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield _sse(self.render(getter.result(), req).model_dump())
                else:
                    getter.cancel()
        finally:
            if not done.done():  # the caller hung up mid-stream: free its slot
                await asyncio.to_thread(self.engine.abort, rid)
        try:
            yield _sse(self.render(done.result(), req).model_dump())
        except InferenceError as e:
            yield _sse(stream_error(e))
        yield b"data: [DONE]\n\n"


def generation_router(engine: NativeEngine, tokenizer: Any) -> APIRouter:
    router = APIRouter()
    generation = Generation(engine, tokenizer)

    @router.post("/generate", response_model=None)
    async def generate(req: GenerateRequest, request: Request) -> Response | dict[str, Any]:
        ids = await generation.prompt_ids(req)
        rid = req.rid or uuid.uuid4().hex
        if req.stream:  # submitted (and so validated) before the 200 starts: a bad request is still a 400
            return generation.streamed(req, ids, rid)
        return await generation.whole(req, ids, rid, request)

    return router


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"

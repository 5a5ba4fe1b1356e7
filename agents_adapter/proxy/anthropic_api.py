"""Anthropic's Messages API (`POST /v1/messages`) as a translation onto the chat pipeline.

`system` becomes the system message; a user turn's `tool_result` blocks become `tool` messages and its
text blocks a user message; an assistant turn's `tool_use` blocks become its tool calls (their `input`
as the JSON text the proxy itself serves tool-call arguments as, so an echoed reply is the served one
and token-in/token-out continues it). `AdapterService.chat` then serves the call exactly as a chat
completion (same `LLMCall`, same session rules). The reply becomes `text` and `tool_use` content blocks
with Anthropic's stop reasons, or, streamed, the API's SSE events (`message_start`,
`content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`).

The session is `X-Session-Id`, else `metadata.user_id`, else a one-call session; task and group come
from the `X-Task-Id` / `X-Group-Id` headers. The key is `x-api-key` or `Authorization: Bearer`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, Tag, field_validator

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.http_requests import validate_fields
from agents_adapter.proxy.openai_models import BodyLimits, ChatCompletionRequest, _Body, few_messages, unsupported
from agents_adapter.proxy.outputs import Reply
from agents_adapter.proxy.service import AdapterService, CallContext, Served

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


def _block_type(value: Any) -> str:
    return str(value.get("type") if isinstance(value, dict) else getattr(value, "type", ""))


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")],
    Discriminator(_block_type),
]


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: list[ContentBlock] = Field(description="the content blocks; a string is one text block")

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return [{"type": "text", "text": value}] if isinstance(value, str) else value


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")

    user_id: str | None = None


class MessagesRequest(_Body):
    """POST /v1/messages. `max_tokens` is required, as in Anthropic's API."""

    model: str = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=1)
    tools: list[ToolParam] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    metadata: Metadata | None = None

    _few_messages = field_validator("messages", mode="before")(few_messages)


# ---------------------------------------------------------------------------------- request -> chat


def _joined(blocks: str | list[TextBlock]) -> str:
    return blocks if isinstance(blocks, str) else "".join(b.text for b in blocks)


def _assistant(content: list[TextBlock | ToolUseBlock | ToolResultBlock], param: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(
        b.text for b in content if isinstance(b, TextBlock))}
    calls = [{"id": b.id, "type": "function", "function": {
        "name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
        for b in content if isinstance(b, ToolUseBlock)]
    if any(isinstance(b, ToolResultBlock) for b in content):
        raise unsupported(param, "tool_result blocks belong in user turns")
    return message | ({"tool_calls": calls} if calls else {})


def _user(content: list[TextBlock | ToolUseBlock | ToolResultBlock], param: str) -> list[dict[str, Any]]:
    """Tool results as tool messages, runs of text blocks as user messages, in their order."""
    out: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, ToolUseBlock):
            raise unsupported(param, "tool_use blocks belong in assistant turns")
        if isinstance(block, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _joined(block.content)})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += block.text
        else:
            out.append({"role": "user", "content": block.text})
    return out


def chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": _joined(req.system)}] if req.system else []
    for i, message in enumerate(req.messages):
        if message.role == "assistant":
            out.append(_assistant(message.content, f"messages.{i}.content"))
        else:
            out += _user(message.content, f"messages.{i}.content")
    return out


def chat_request(req: MessagesRequest, limits: BodyLimits) -> ChatCompletionRequest:
    choice, parallel = _chat_tool_choice(req.tool_choice)
    fields: dict[str, Any] = {
        "model": req.model, "messages": chat_messages(req), "max_tokens": req.max_tokens, "stop": req.stop_sequences,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "user": req.metadata.user_id if req.metadata else None,
        "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.input_schema}} for t in req.tools]
        if req.tools else None,
    }
    return validate_fields({k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest, limits)


def _chat_tool_choice(tool_choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as chat's (and its parallel_tool_calls): auto, none, any (required) or a
    named tool (a forced call: constrained decoding)."""
    choice = tool_choice or {}
    kind = choice.get("type", "auto")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise unsupported("tool_choice", f"{choice!r}: expected type auto, none, any, or tool with a name")


# ------------------------------------------------------------------------------------------ serving


class MessagesApi:
    """Serves /v1/messages on `service.chat`."""

    def __init__(self, service: AdapterService, limits: BodyLimits) -> None:
        self.service = service
        self.limits = limits

    @staticmethod
    def session_hints(_: str, req: MessagesRequest) -> tuple[str | None, dict[str, str] | None]:
        return (req.metadata.user_id if req.metadata else None), None

    async def serve(self, ctx: CallContext, req: MessagesRequest) -> Served:
        return await self.service.chat(ctx, chat_request(req, self.limits))



def message_body(codec: ChatCodec, req: MessagesRequest, served: Served) -> dict[str, Any]:
    """The `message` object of a served call."""
    reply = served.replies[0]
    reason, sequence = _stop(codec, req, reply)
    return {
        "id": f"msg_{reply.call_id}", "type": "message", "role": "assistant", "model": req.model,
        "content": _content(reply), "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": served.prompt_tokens, "output_tokens": len(reply.call.output_ids)},
        "sflow": served.extra,
    }


def _stop(codec: ChatCodec, req: MessagesRequest, reply: Reply) -> tuple[str, str | None]:
    """Anthropic's stop reason; a stop sequence that cut the reply is in the text its tokens decode to."""
    if reply.finish_reason in _STOP_REASONS:
        return _STOP_REASONS[reply.finish_reason], None
    decoded = codec.decode(reply.body_ids)
    found = [(decoded.find(s), s) for s in req.stop_sequences or () if s in decoded]
    return ("stop_sequence", min(found)[1]) if found else ("end_turn", None)


def _content(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text or not reply.tool_calls else []
    for call in reply.tool_calls or ():
        arguments = call["function"]["arguments"]
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = None
        blocks.append({"type": "tool_use", "id": f"toolu_{call['id'].removeprefix('call_')}",
                       "name": call["function"]["name"],
                       "input": parsed if isinstance(parsed, dict) else {"arguments": arguments}})
    return blocks


def message_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The streamed form of a finished message: start, each content block's start/delta/stop, delta, stop."""
    start = body | {"content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": body["usage"] | {"output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            empty, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            empty = block | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        events += [("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}),
                   ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": index})]
    events += [("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
                                  "usage": {"output_tokens": body["usage"]["output_tokens"]}}),
               ("message_stop", {"type": "message_stop"})]
    return events

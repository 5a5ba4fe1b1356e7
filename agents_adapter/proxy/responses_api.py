"""OpenAI's Responses API (`POST /v1/responses`) as a translation onto the chat pipeline.

A request's `instructions` + `input` items become chat messages (an assistant `message` item and the
`function_call` items after it are one assistant turn; a `function_call_output` is a `tool` message),
its function tools chat tools; `AdapterService.chat` then serves it exactly as a chat completion:
same token-in/token-out, same `LLMCall`, same session. The reply becomes `output` items (an
`output_text` message and one `function_call` item per tool call) or, streamed, the API's typed SSE
events (`response.created` ... `response.completed`).

`previous_response_id` continues that response's conversation and its session. Each kept response
holds only what its request added (the new input messages and the reply), linked to its parent, so a
chain costs its messages once (`ResponseChain`). As in OpenAI's API, `instructions` are not carried
over (an agent sends them again each turn, and tools too); a response made with `store: false` is not
kept. Kept responses live in memory (`responses_kept`, idle `session_ttl_s`): an id that is not kept
is a 404, and a request naming it must send its whole input instead.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, Tag, ValidationInfo, field_validator

from agents_adapter.errors import InvalidParameterError, UnknownResponseError
from agents_adapter.proxy.http_requests import validate_fields
from agents_adapter.proxy.openai_models import BodyLimits, ChatCompletionRequest, _Body, _limits, unsupported
from agents_adapter.proxy.outputs import Reply, usage
from agents_adapter.proxy.service import AdapterService, CallContext, Served

_TEXT_PARTS = ("input_text", "output_text", "refusal")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    refusal: str | None = None


class InputMessage(BaseModel):
    """A `message` item (its `type` may be left out, as in OpenAI's easy input form)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


def _item_type(value: Any) -> str:
    return str((value.get("type") if isinstance(value, dict) else getattr(value, "type", None)) or "message")


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(_Body):
    """POST /v1/responses. Vendor extensions as on chat: `top_k`, `seed`, `ignore_eos`."""

    model: str = Field(min_length=1)
    input: list[InputItem] = Field(description="the input items; a string is one user message")
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    ignore_eos: bool = False
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _few_items(cls, value: Any, info: ValidationInfo) -> Any:
        limit = _limits(info).max_messages
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}]
        if isinstance(value, list) and not value:
            raise ValueError("input is an empty list: send a string or at least one item")
        if isinstance(value, list) and len(value) > limit:
            raise ValueError(f"{len(value)} input items; this proxy accepts at most max_messages={limit}")
        return value


# ------------------------------------------------------------------------------------- input -> chat


def _part_text(part: ContentPart, param: str) -> str:
    if part.type not in _TEXT_PARTS:
        raise unsupported(param, f"content parts of type {part.type!r} are not served (text only)")
    return (part.refusal if part.type == "refusal" else part.text) or ""


def _text(content: str | list[ContentPart], param: str) -> str:
    return content if isinstance(content, str) else "".join(_part_text(p, param) for p in content)


def input_messages(items: Sequence[InputMessage | FunctionCallItem | FunctionCallOutputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages: an assistant message and the function calls after it are one turn."""
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant turn function calls attach to
    for i, item in enumerate(items):
        param = f"input.{i}"
        if isinstance(item, FunctionCallItem):
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            turn.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}})
            continue
        if isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, param)})
            turn = None
            continue
        out.append({"role": item.role, "content": _text(item.content, param)})
        turn = out[-1] if item.role == "assistant" else None
    return out


def chat_request(req: ResponsesRequest, history: Sequence[dict[str, Any]], added: Sequence[dict[str, Any]],
                 limits: BodyLimits) -> ChatCompletionRequest:
    """The chat request the Responses request means: instructions, the kept history, the new input."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    fields: dict[str, Any] = {
        "model": req.model, "messages": [*system, *history, *added], "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
        "ignore_eos": req.ignore_eos, "tool_choice": _chat_tool_choice(req.tool_choice), "user": req.user,
        "metadata": req.metadata,
        "parallel_tool_calls": req.parallel_tool_calls, "response_format": _response_format(req.text),
        "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                  for t in req.tools] if req.tools else None,
    }
    return validate_fields({k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest, limits)


def _chat_tool_choice(tool_choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The Responses API's named function `{"type": "function", "name"}` in chat's form."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and "name" in tool_choice:
        return {"type": "function", "function": {"name": tool_choice["name"]}}
    if isinstance(tool_choice, dict):
        raise unsupported("tool_choice", f"{tool_choice!r}: expected 'none', 'auto', 'required' or "
                                         "{'type': 'function', 'name': ...}")
    return tool_choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's response_format: json_schema's name/schema/strict sit in `format` itself."""
    fmt = (text or {}).get("format") or {"type": "text"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return dict(fmt)


# ---------------------------------------------------------------------------------- kept responses


@dataclass(frozen=True)
class _Kept:
    agent_id: str
    session_id: str
    parent_id: str | None
    messages: tuple[dict[str, Any], ...]  # what this response's request added, and its reply
    at: float


class ResponseChain:
    """Responses kept for `previous_response_id`, each linked to the one it continued (LRU, idle TTL)."""

    def __init__(self, max_kept: int, ttl_s: float) -> None:
        self.max_kept = max_kept
        self.ttl_s = ttl_s
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    def keep(self, response_id: str, agent_id: str, session_id: str, parent_id: str | None,
             messages: Sequence[dict[str, Any]]) -> None:
        self._kept[response_id] = _Kept(agent_id, session_id, parent_id, tuple(messages), time.monotonic())
        while len(self._kept) > self.max_kept:
            self._kept.popitem(last=False)

    def session_of(self, agent_id: str, response_id: str) -> str:
        return self._get(agent_id, response_id).session_id

    def history(self, agent_id: str, response_id: str) -> list[dict[str, Any]]:
        """The conversation up to and including `response_id`'s reply."""
        parts: list[tuple[dict[str, Any], ...]] = []
        rid: str | None = response_id
        while rid is not None:
            kept = self._get(agent_id, rid, continued=response_id)
            self._kept.move_to_end(rid)
            parts.append(kept.messages)
            rid = kept.parent_id
        return [m for part in reversed(parts) for m in part]

    def _get(self, agent_id: str, response_id: str, continued: str | None = None) -> _Kept:
        kept = self._kept.get(response_id)
        if kept is not None and time.monotonic() - kept.at > self.ttl_s:
            del self._kept[response_id]
            kept = None
        if kept is None or kept.agent_id != agent_id:
            earlier = f" (an earlier response of {continued!r})" if continued not in (None, response_id) else ""
            raise UnknownResponseError(
                f"previous_response_id: response {response_id!r}{earlier} is not kept here (never served, "
                "stored with store=false, or forgotten); send the whole input instead", param="previous_response_id")
        return kept


# ------------------------------------------------------------------------------------------ serving


class ResponsesApi:
    """Serves /v1/responses on `service.chat`; keeps the responses for `previous_response_id`."""

    def __init__(self, service: AdapterService, limits: BodyLimits) -> None:
        self.service = service
        self.limits = limits
        self.chain = ResponseChain(service.config.responses_kept, service.config.session_ttl_s)

    def session_hints(self, agent_id: str, req: ResponsesRequest) -> tuple[str | None, dict[str, str] | None]:
        """Session and metadata of the call: a continued response's session comes before the body's user."""
        if req.previous_response_id:
            return self.chain.session_of(agent_id, req.previous_response_id), req.metadata
        return req.user, req.metadata

    async def serve(self, ctx: CallContext, req: ResponsesRequest) -> Served:
        history: list[dict[str, Any]] = []
        if req.previous_response_id:
            session = self.chain.session_of(ctx.agent_id, req.previous_response_id)
            if session != ctx.session_id:
                raise InvalidParameterError(
                    f"previous_response_id {req.previous_response_id!r} is in session {session!r}, "
                    f"not in {ctx.session_id!r} (X-Session-Id)", param="previous_response_id")
            history = self.chain.history(ctx.agent_id, req.previous_response_id)
        added = input_messages(req.input)
        served = await self.service.chat(ctx, chat_request(req, history, added, self.limits))
        served = replace(served, response_id=f"resp_{uuid.uuid4().hex}")
        if req.store:
            self.chain.keep(served.response_id, ctx.agent_id, ctx.session_id, req.previous_response_id,
                            [*added, served.replies[0].message()])
        return served


# ------------------------------------------------------------------------------------------- bodies


def _output(reply: Reply, status: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        items.append({"type": "message", "id": f"msg_{reply.call_id}", "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}]})
    items += [{"type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
               "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}
              for call in reply.tool_calls or ()]
    return items


def response_body(req: ResponsesRequest, served: Served) -> dict[str, Any]:
    """The `response` object of a served call."""
    reply = served.replies[0]
    tokens = usage(served.prompt_tokens, served.replies)
    incomplete = reply.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    return {
        "id": served.response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "model": req.model, "output": _output(reply, status), "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions, "previous_response_id": req.previous_response_id,
        "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "tool_choice": req.tool_choice or "auto", "parallel_tool_calls": req.parallel_tool_calls is not False,
        "store": req.store, "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
        "truncation": "disabled", "user": req.user,
        "usage": {"input_tokens": tokens["prompt_tokens"],
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": tokens["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens["total_tokens"]},
        "sflow": served.extra,
    }


def response_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The streamed form of a finished response: created, each output item's events, completed."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    emit("response.created", response=body | {"status": "in_progress", "output": [], "usage": None})
    emit("response.in_progress", response=body | {"status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(body["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            emit("response.output_item.added", output_index=index, item=item | {"status": "in_progress",
                                                                                  "content": []})
            emit("response.content_part.added", **where, content_index=0, part=part | {"text": ""})
            emit("response.output_text.delta", **where, content_index=0, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
            emit("response.content_part.done", **where, content_index=0, part=part)
        else:
            emit("response.output_item.added", output_index=index, item=item | {"status": "in_progress",
                                                                                  "arguments": ""})
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    emit(f"response.{body['status']}", response=body)
    return events

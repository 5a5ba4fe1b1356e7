"""From an engine output to what the agent reads: text, tool calls, stop sequences, logprobs, and the
OpenAI response bodies (chat.completion, chat.completion.chunk, text_completion).

The recorded tokens are the ones the agent's answer comes from: a trailing stop token is kept in
the record (the engine produced it, and token-in/token-out glues the next turn after it) but not shown;
a stop *sequence* cuts the output at the first token that completes it, in the record too (a prefix of
a sample is a sample of the prefix, so logprobs stay valid).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.stitching import StitchedCall

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class Reply:
    """One choice as served: its call, the text shown, parsed tool calls, OpenAI finish reason."""

    call_id: str
    call: StitchedCall
    body_ids: list[int]  # the output tokens the text comes from (no trailing stop token)
    text: str
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    turn: int = -1

    def message(self) -> dict[str, Any]:
        """The assistant message as served (and as the agent sends it back next turn)."""
        if self.tool_calls:
            return {"role": "assistant", "content": self.text or None, "tool_calls": self.tool_calls}
        return {"role": "assistant", "content": self.text}


def parse_tool_calls(text: str, style: str = "hermes") -> tuple[str, list[dict[str, Any]]] | None:
    """The tool calls of a reply, in the form the model's template writes them (`ChatCodec.tool_call_style`):
    "hermes" (Qwen): `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks; "json" (Llama 3):
    the whole reply is one `{"name": ..., "parameters": ...}` object, after an optional <|python_tag|>.

    None (the whole text is content) unless every call is a JSON object with a string name: a
    malformed call is shown to the agent as text rather than half-parsed.
    """
    if style == "json":
        body = text.strip().removeprefix("<|python_tag|>")
        call = _call_of(body, "parameters") if body.startswith("{") else None
        return None if call is None else ("", [call])
    blocks = _TOOL_CALL.findall(text)
    calls = [_call_of(block, "arguments") for block in blocks]
    if not calls or any(c is None for c in calls):
        return None
    return _TOOL_CALL.sub("", text).strip(), [c for c in calls if c is not None]


def _call_of(block: str, arguments_key: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": obj["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
        },
    }


def _first_stop(text: str, stops: Sequence[str]) -> int:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else -1


def finish_reply(codec: ChatCodec, call_id: str, call: StitchedCall, *, stops: Sequence[str],
                 stop_token_ids: Collection[int], parse_tools: bool,
                 skip_special_tokens: bool = False) -> Reply:
    """Decodes a finished call into the reply shown to the agent (and cuts it at a stop sequence)."""
    body = list(call.output_ids)
    if call.finish_reason == "stop" and body and (body[-1] in codec.eos_token_ids or body[-1] in stop_token_ids):
        body = body[:-1]
    text = codec.decode(body, skip_special_tokens=skip_special_tokens)
    if stops and _first_stop(text, stops) >= 0:
        low, high = 1, len(body)  # smallest prefix whose text holds a stop sequence
        while low < high:
            mid = (low + high) // 2
            if _first_stop(codec.decode(body[:mid], skip_special_tokens=skip_special_tokens), stops) >= 0:
                high = mid
            else:
                low = mid + 1
        body = body[:low]
        call.truncate(low)
        text = codec.decode(body, skip_special_tokens=skip_special_tokens)
        cut = _first_stop(text, stops)
        text = text[:cut] if cut >= 0 else text
    tool_calls = None
    if parse_tools:
        parsed = parse_tool_calls(text, codec.tool_call_style)
        if parsed is not None:
            text, tool_calls = parsed
    finish = "tool_calls" if tool_calls else call.finish_reason
    return Reply(call_id, call, body, text, tool_calls, finish)


# ------------------------------------------------------------------------------------------ logprobs


def chat_logprobs(codec: ChatCodec, reply: Reply, top_logprobs: int) -> dict[str, Any]:
    """OpenAI's `choices[].logprobs`: only the sampled token's logprob is known, so `top_logprobs`
    holds that token alone whatever number was asked for."""
    content = []
    for token, logprob in zip(reply.body_ids, reply.call.logprobs, strict=False):
        entry = {"token": codec.decode([token]), "logprob": logprob, "bytes": list(codec.token_bytes(token))}
        content.append({**entry, "top_logprobs": [entry] if top_logprobs else []})
    return {"content": content, "refusal": None}


def completion_logprobs(codec: ChatCodec, reply: Reply, top: int) -> dict[str, Any]:
    tokens = [codec.decode([t]) for t in reply.body_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    logprobs = list(reply.call.logprobs[: len(tokens)])
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, logprobs, strict=True)] if top else None,
        "text_offset": offsets,
    }


# ---------------------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, replies: Sequence[Reply]) -> dict[str, int]:
    completion = sum(len(r.call.output_ids) for r in replies)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def chat_completion(response_id: str, model: str, replies: Sequence[Reply], prompt_tokens: int,
                    logprobs: dict[int, dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "message": r.message(), "logprobs": logprobs.get(i), "finish_reason": r.finish_reason}
            for i, r in enumerate(replies)
        ],
        "usage": usage(prompt_tokens, replies),
        "system_fingerprint": None,
        "sflow": extra,
    }


def chat_chunks(response_id: str, model: str, replies: Sequence[Reply], prompt_tokens: int,
                logprobs: dict[int, dict[str, Any]], include_usage: bool,
                extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE chunks of a finished completion (role, content, tool calls, finish; then usage)."""
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": choices, **more}

    out = []
    for i, r in enumerate(replies):
        out.append(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
        if r.text:
            out.append(chunk([{"index": i, "delta": {"content": r.text}, "logprobs": logprobs.get(i),
                               "finish_reason": None}]))
        if r.tool_calls:
            deltas = [{"index": k, **call} for k, call in enumerate(r.tool_calls)]
            out.append(chunk([{"index": i, "delta": {"tool_calls": deltas}, "finish_reason": None}]))
        out.append(chunk([{"index": i, "delta": {}, "finish_reason": r.finish_reason}], sflow=extra))
    if include_usage:
        out.append(chunk([], usage=usage(prompt_tokens, replies)))
    return out


def text_completion(response_id: str, model: str, replies: Sequence[Reply], prompt_tokens: int,
                    logprobs: dict[int, dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": r.text, "logprobs": logprobs.get(i), "finish_reason": r.finish_reason}
            for i, r in enumerate(replies)
        ],
        "usage": usage(prompt_tokens, replies),
        "sflow": extra,
    }


def text_chunks(response_id: str, model: str, replies: Sequence[Reply], prompt_tokens: int,
                logprobs: dict[int, dict[str, Any]], include_usage: bool,
                extra: dict[str, Any]) -> list[dict[str, Any]]:
    created = int(time.time())
    out: list[dict[str, Any]] = [
        {"id": response_id, "object": "text_completion", "created": created, "model": model,
         "choices": [{"index": i, "text": r.text, "logprobs": logprobs.get(i), "finish_reason": r.finish_reason}],
         "sflow": extra}
        for i, r in enumerate(replies)
    ]
    if include_usage:
        out.append({"id": response_id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage(prompt_tokens, replies)})
    return out

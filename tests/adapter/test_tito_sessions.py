"""Property: random multi-turn sessions (text with tool calls, think blocks, non-ASCII) under each chat
format and the byte-level BPE keep token-in/token-out exact, and every drift is classified when it
happens: no drift on unedited sessions, each edited history flagged once, as a fork.

The functional core is driven as the proxy drives it (`TitoBuilder.chat_prompt`, the engine's output
ids, `finish_reply`, `remember_chat`). The engine is simulated at its true edge only: its output ids
are the reply's text encoded in random pieces, so they are rarely the tokenization a re-encoding of
the conversation would give (as with a sampled model, and unlike a byte-level tokenizer, where they
always are).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import finish_reply
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import CONTINUATION, FORK, REALIGNED, TitoBuilder
from inference_svc.default_model import TEMPLATES, build_tokenizer

pytestmark = pytest.mark.unit
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}, "note": {"type": "string"}}}}}]
# letters, digits, punctuation (no '<': no special token is typed), accents, Greek, CJK, emoji
CHARS = st.characters(codec="utf-8", categories=("L", "N", "P", "Zs", "So"), exclude_characters="<>{}\u2028\u2029",
                      max_codepoint=0x1F64F)
WORDS = st.text(CHARS, min_size=1, max_size=20).map(str.strip).filter(bool)
EXPRESSION = st.from_regex(r"[0-9]{1,3}( ?[-+*] ?[0-9]{1,3}){0,3}", fullmatch=True)


@dataclass
class Turn:
    """What the simulated model writes, and how the proxy must class the prompt that follows it."""

    text: str
    stopped: bool
    tool_call: bool
    realigns: bool  # the template re-renders this reply otherwise than the model wrote it
    think: bool


@pytest.fixture(scope="module")
def codecs() -> dict[str, ChatCodec]:
    out = {}
    for name, family in TEMPLATES.items():
        tokenizer = build_tokenizer("bpe", name)
        out[name] = ChatCodec(tokenizer, [tokenizer.convert_tokens_to_ids(t) for t in family.stop])
    return out


def _call_text(template: str, arguments: dict[str, str], compact: bool) -> str:
    args = json.dumps(arguments, ensure_ascii=False, separators=(",", ":") if compact else None)
    if template == "llama3":
        return '{"name": "calculator", "parameters": ' + args + "}"
    return '<tool_call>\n{"name": "calculator", "arguments": ' + args + "}\n</tool_call>"


def _turn(draw: Any, template: str, tools: bool) -> Turn:
    """A reply in one of the shapes models write: plain, padded with spaces, with a think block, a tool
    call (canonical or compact JSON); whether it realigns follows from how each format renders history."""
    kind = draw(st.sampled_from(["plain", "padded", "think", "call", "compact_call"] if tools
                                else ["plain", "padded", "think"]))
    text, stopped = draw(WORDS), draw(st.booleans()) or kind.endswith("call")
    if kind == "padded":
        return Turn(f" {text} ", stopped, False, template == "llama3", False)  # Llama 3 trims contents
    if kind == "think":  # Qwen3 drops the reasoning of a turn a new query follows
        return Turn(f"<think>\n{draw(WORDS)}\n</think>\n\n{text}", stopped, False, template == "qwen3", True)
    if kind == "plain":
        return Turn(text, stopped, False, False, False)
    arguments = {"expression": draw(EXPRESSION), **({"note": draw(WORDS)} if draw(st.booleans()) else {})}
    think = template == "qwen3" and draw(st.booleans())  # kept: tool results are no new query
    prefix = f"<think>\n{draw(WORDS)}\n</think>\n\n" if think else ""
    return Turn(prefix + _call_text(template, arguments, kind == "compact_call"), True, True,
                kind == "compact_call", think)


def _engine_output(draw: Any, codec: ChatCodec, turn: Turn) -> list[int]:
    """The reply's ids as a sampled model may produce them: its text encoded in random pieces."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(turn.text) - 1)), max_size=4))))
    pieces = [turn.text[a:b] for a, b in zip([0, *cuts], [*cuts, len(turn.text)], strict=True)]
    ids = [i for piece in pieces if piece for i in codec.encode(piece)]
    return ids + ([codec.tokenizer.eos_token_id] if turn.stopped else [])


def _edit(draw: Any, messages: list[dict[str, Any]]) -> bool:
    """Edits one served assistant turn (its text, or a call's arguments); False if there is none."""
    served = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not served:
        return False
    i = draw(st.sampled_from(served))
    message = dict(messages[i])
    if message.get("tool_calls") and draw(st.booleans()):
        call = message["tool_calls"][0]
        message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": '{"expression": "0"}'}}]
    else:
        message["content"] = (message.get("content") or "") + " (edited)"
    messages[i] = message
    return True


def _follow_up(draw: Any, reply_message: dict[str, Any]) -> list[dict[str, Any]]:
    if reply_message.get("tool_calls"):
        return [{"role": "tool", "tool_call_id": reply_message["tool_calls"][0]["id"], "content": draw(WORDS)}
                for _ in range(draw(st.integers(1, 2)))]
    return [{"role": "user", "content": draw(WORDS)}]


def _session(codec: ChatCodec, template: str, data: Any) -> None:
    builder, state = TitoBuilder(codec, 64), SessionState("s", "agent")
    tools = TOOLS if data.draw(st.booleans()) else None
    messages: list[dict[str, Any]] = [{"role": "user", "content": data.draw(WORDS)}]
    if data.draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": data.draw(WORDS)})
    previous: tuple[list[int], str] | None = None  # (prompt + output ids, call id) of the last call
    expected_class, text_exact, edits = "", True, 0
    seen: Counter[str] = Counter()
    for turn_no in range(data.draw(st.integers(2, 6))):
        edited = turn_no > 0 and data.draw(st.integers(0, 5)) == 5 and _edit(data.draw, messages)
        built = builder.chat_prompt(state, messages, tools)
        seen[built.drift_class] += 1
        if edited:  # the history no longer extends a served call: a fork, tokenized afresh
            edits += 1
            assert (built.drift, built.drift_class, built.reused_tokens) == (True, FORK, 0)
            assert built.ids == codec.encode(codec.render(messages, tools))
        elif previous is not None:  # the exact ids the engine read and wrote, then the new messages
            full, call_id = previous
            assert built.ids[: len(full)] == full and built.parent_call_id == call_id
            assert not built.drift and built.drift_class == expected_class, f"turn {turn_no}"
        else:
            assert (built.drift, built.drift_class) == (False, "")
        if text_exact:  # no reply the template writes otherwise yet: the text is the template's, too
            assert codec.decode(built.ids) == codec.render(messages, tools)
        turn = _turn(data.draw, template, tools is not None)
        output = _engine_output(data.draw, codec, turn)
        call_id = f"c{turn_no}"
        reply = finish_reply(codec, call_id, StitchedCall(built.ids, 10_000, output, [0.0] * len(output),
                                                          finish_reason="stop" if turn.stopped else "length"),
                             stops=(), stop_token_ids=(), parse_tools=tools is not None)
        assert bool(reply.tool_calls) == turn.tool_call, turn.text
        builder.remember_chat(state, built, reply.message(), call_id, output)
        state.calls_served += 1
        previous = (built.ids + output, call_id)
        expected_class = REALIGNED if turn.realigns else CONTINUATION
        text_exact = text_exact and not turn.realigns and not (turn.think and template == "qwen3")
        messages += [reply.message(), *_follow_up(data.draw, reply.message())]
    assert seen[FORK] == edits  # each edited history flagged exactly once


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_sessions_keep_exact_ids_and_class_every_drift(codecs: dict[str, ChatCodec], template: str,
                                                       data: Any) -> None:
    _session(codecs[template], template, data)

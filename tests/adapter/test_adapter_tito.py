"""Token-in / token-out: prompts reuse the exact served ids; the concatenation convention is the template's."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_adapter.errors import TemplateError
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import parse_tool_calls
from agents_adapter.proxy.session_cache import SessionCache, SessionState
from agents_adapter.proxy.tito import TitoBuilder, _chain, canonical_message, tools_seed
from inference_svc.default_model import build_tokenizer

pytestmark = pytest.mark.unit
IM_END = 258
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def serve(builder: TitoBuilder, state: SessionState, messages: list[dict[str, Any]], output_ids: list[int],
          reply: dict[str, Any], tools: Any = None, call_id: str = "") -> tuple[list[int], Any]:
    """What the proxy does for one call: build the prompt, 'generate' output_ids, remember the reply."""
    prompt = builder.chat_prompt(state, messages, tools)
    builder.remember_chat(state, prompt, reply, call_id or f"c{state.calls_served}", output_ids)
    state.calls_served += 1
    return prompt.ids, prompt


def test_probe_finds_the_chatml_convention(codec: ChatCodec) -> None:
    assert codec.convention.turn_close == "<|im_end|>\n"
    assert codec.convention.generation_prompt == "<|im_start|>assistant\n"
    assert codec.glue([65, IM_END]) == "\n"  # the stop token is already in the output
    assert codec.glue([65, 66]) == "<|im_end|>\n"  # cut by max_tokens: the template closes the turn


def test_a_template_that_rewrites_history_is_refused() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (  # drops earlier assistant turns (as reasoning templates do): no prefix property
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="token-in/token-out"):
        ChatCodec(tokenizer, [IM_END])


def test_extension_reuses_exact_ids_even_when_text_does_not_round_trip(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    garbage = [0xC3, 0x28, 0xFF, 65, IM_END]  # invalid UTF-8: decodes to U+FFFD, re-encodes differently
    first, _ = serve(builder, state, messages, garbage, {"role": "assistant", "content": codec.decode(garbage[:-1])})
    messages += [{"role": "assistant", "content": codec.decode(garbage[:-1])}, {"role": "user", "content": "more"}]
    second, built = serve(builder, state, messages, [66, IM_END], {"role": "assistant", "content": "B"})
    assert second[: len(first) + len(garbage)] == first + garbage
    assert second[len(first) + len(garbage):] == codec.encode("\n" + codec.render([messages[-1]]))
    assert not built.drift and built.parent_call_id == "c0"
    fresh = codec.encode(codec.render(messages))
    assert fresh != second  # re-tokenizing the text would have changed the tokens the model produced


WORDS = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="<>"), max_size=15)


def _reply(draw: Any) -> tuple[str, dict[str, Any], bool]:
    """(text the model writes, message the proxy serves for it, stopped on <|im_end|>)."""
    if draw(st.booleans()):
        expression = draw(st.from_regex(r"[0-9+*() -]{1,12}", fullmatch=True))
        text = ('<tool_call>\n{"name": "calculator", "arguments": ' + json.dumps({"expression": expression})
                + "}\n</tool_call>")
        parsed = parse_tool_calls(text)
        assert parsed is not None
        return text, {"role": "assistant", "content": None, "tool_calls": parsed[1]}, True
    text = draw(WORDS)
    return text, {"role": "assistant", "content": text}, draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_clean_conversations_tokenize_exactly_like_the_full_template(codec: ChatCodec, data: Any) -> None:
    """The core property: when the model's text is what the template would render, the prompt built
    from served ids + suffix equals tokenizing the whole conversation with the template."""
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    tools = TOOLS if data.draw(st.booleans()) else None
    messages: list[dict[str, Any]] = [{"role": "user", "content": data.draw(WORDS)}]
    if data.draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": data.draw(WORDS)})
    for turn in range(data.draw(st.integers(1, 4)) + 1):
        built = builder.chat_prompt(state, messages, tools)
        assert built.ids == codec.encode(codec.render(messages, tools)), f"turn {turn}"
        assert not built.drift and built.parent_call_id == ("" if turn == 0 else f"t{turn - 1}")
        text, served, stopped = _reply(data.draw)
        builder.remember_chat(state, built, served, f"t{turn}", codec.encode(text) + ([IM_END] if stopped else []))
        state.calls_served += 1
        messages.append(served)
        if served.get("tool_calls"):
            messages += [{"role": "tool", "content": data.draw(WORDS)} for _ in range(data.draw(st.integers(1, 2)))]
        else:
            messages.append({"role": "user", "content": data.draw(WORDS)})


def test_edited_history_is_drift_and_tokenized_afresh(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    messages = [{"role": "user", "content": "q"}]
    serve(builder, state, messages, [65, IM_END], {"role": "assistant", "content": "A"})
    edited = [*messages, {"role": "assistant", "content": "A, edited"}, {"role": "user", "content": "q2"}]
    built = builder.chat_prompt(state, edited, None)
    assert built.drift and built.parent_call_id == "" and built.reused_tokens == 0
    assert built.ids == codec.encode(codec.render(edited))
    # assistant turns after the served part (the agent spliced in its own) are drift too
    spliced = [*messages, {"role": "assistant", "content": "A"}, {"role": "user", "content": "u"},
               {"role": "assistant", "content": "invented"}, {"role": "user", "content": "u2"}]
    assert builder.chat_prompt(state, spliced, None).drift


def test_first_call_with_few_shot_history_and_changed_tools(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    few_shot = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"},
                {"role": "user", "content": "2+2"}]
    assert not builder.chat_prompt(state, few_shot, None).drift  # context, not drift: nothing was served yet
    serve(builder, state, few_shot, [52, IM_END], {"role": "assistant", "content": "4"})
    follow = [*few_shot, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3"}]
    assert builder.chat_prompt(state, follow, None).parent_call_id == "c0"
    changed_tools = builder.chat_prompt(state, follow, TOOLS)  # a different system header: not an extension
    assert changed_tools.parent_call_id == "" and changed_tools.drift


def test_leading_system_message_in_the_new_messages(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    messages = [{"role": "user", "content": "q"}]
    serve(builder, state, messages, [65, IM_END], {"role": "assistant", "content": "A"}, TOOLS)
    more = [*messages, {"role": "assistant", "content": "A"}, {"role": "system", "content": "note"},
            {"role": "user", "content": "q2"}]
    built = builder.chat_prompt(state, more, TOOLS)
    assert built.parent_call_id == "c0"
    assert built.ids == codec.encode(codec.render(more, TOOLS))


def test_canonical_form_ignores_what_does_not_render(codec: ChatCodec) -> None:
    served = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}]}
    echoed = {"role": "assistant", "content": "", "refusal": None, "tool_calls": [
        {"id": "other", "type": "function", "function": {"name": "f", "arguments": {"b": [2], "a": 1}}}]}
    assert canonical_message(served) == canonical_message(echoed)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert canonical_message({"role": "user", "content": parts}) == canonical_message({"role": "user", "content": "ab"})
    assert canonical_message({"role": "user", "content": "a"}) != canonical_message({"role": "user", "content": "a "})


@settings(max_examples=300, deadline=None)
@given(role=st.sampled_from(["system", "user", "assistant", "tool"]),
       content=st.text(st.characters(blacklist_categories=["Cs"])), name=st.sampled_from([None, ""]),
       calls=st.sampled_from([None, []]))
def test_the_plain_message_form_is_the_json_form(role: str, content: str, name: str | None,
                                                   calls: list[Any] | None) -> None:
    """The written-out form of a text message is byte for byte json.dumps's: stored session keys stay valid."""
    message = {"role": role, "content": content, "name": name, "tool_calls": calls}
    as_json = json.dumps([role, content, "", []], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert canonical_message(message) == as_json.encode("utf-8")


_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.sampled_from(["a", "b", ""])}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(), "tool_calls": st.just(
        [{"function": {"name": "f", "arguments": {"x": 1}}}])}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(), "tool_calls": st.just(
        [{"function": {"name": "f", "arguments": {"x": 1.0}}}])}),
)


@settings(max_examples=200, deadline=None)
@given(first=st.lists(_MESSAGE, max_size=8), second=st.lists(_MESSAGE, max_size=8), keep=st.integers(0, 8),
       tools=st.sampled_from([None, TOOLS]))
def test_prefix_hashes_reused_from_the_last_request_are_the_fresh_ones(
        first: list[dict[str, Any]], second: list[dict[str, Any]], keep: int, tools: Any) -> None:
    """A request that repeats part of the last one (then differs: a new turn, an edit, 1 for 1.0 in tool
    arguments, other tools) gets exactly the hashes computed without the last request."""
    _, previous = _chain(tools_seed(TOOLS), first)
    messages = [dict(m) for m in first[:keep]] + second
    assert _chain(tools_seed(tools), messages, previous)[0] == _chain(tools_seed(tools), messages)[0]


def test_text_and_token_prompts_extend_and_drift(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    first = builder.text_prompt(state, "Q: 1+1\nA:")
    output = [0xFF, 50]  # the served text is what the agent saw: U+FFFD + "2"
    builder.remember_text(state, first, codec.decode(output), "t0", output)
    state.calls_served = 1
    extended = builder.text_prompt(state, "Q: 1+1\nA:" + codec.decode(output) + "\nQ: 2+2\nA:")
    assert extended.parent_call_id == "t0"
    assert extended.ids == first.ids + output + codec.encode("\nQ: 2+2\nA:")
    assert builder.text_prompt(state, "Q: 1+1\nA: 3\nQ:").drift  # the served answer was edited
    assert not builder.text_prompt(state, "unrelated").drift

    tokens = builder.token_prompt(state, [1, 2, 3])
    builder.remember_tokens(state, tokens, "k0", [4, 5])
    assert builder.token_prompt(state, [1, 2, 3, 4, 5, 6]).parent_call_id == "k0"
    assert builder.token_prompt(state, [1, 2, 3, 9, 9]).drift
    assert not builder.token_prompt(state, [1, 2, 3]).drift  # the same prompt again: another sample


def test_served_calls_per_session_are_bounded(codec: ChatCodec) -> None:
    builder, state = TitoBuilder(codec, 2), SessionState("s", "a")
    for i in range(3):
        prompt = builder.chat_prompt(state, [{"role": "user", "content": f"q{i}"}], None)
        builder.remember_chat(state, prompt, {"role": "assistant", "content": "a"}, f"c{i}", [97, IM_END])
    assert [c.call_id for c in state.chat_calls.values()] == ["c1", "c2"]


def test_session_cache_is_lru_with_ttl() -> None:
    now = [0.0]
    evicted: list[tuple[str, str]] = []
    cache = SessionCache(2, ttl_s=10.0, clock=lambda: now[0],
                         on_evict=lambda s, why: evicted.append((s.session_id, why)))
    for sid in ("a", "b"):
        cache.get_or_create(sid, functools.partial(SessionState, sid, "agent"))
    assert cache.get("a") is not None  # a is now the most recent
    cache.get_or_create("c", lambda: SessionState("c", "agent"))
    assert evicted == [("b", "lru")] and cache.get("b") is None
    now[0] = 5.0
    assert cache.get("a") is not None
    now[0] = 14.0
    assert cache.sweep() == 1  # c idle 14 s > 10 s; a was used at 5 s
    assert evicted[-1] == ("c", "ttl")
    now[0] = 16.0
    assert cache.get("a") is None and cache.expired_ttl == 2
    _state, created = cache.get_or_create("a", lambda: SessionState("a", "agent"))
    assert created and len(cache) == 1


def test_a_growing_session_keeps_one_buffer_of_ids_and_a_fork_its_own(codec: ChatCodec) -> None:
    """Cached calls that a new call extends read their ids from its buffer (a prefix of it), so a session's
    prompt cache holds its latest context once, not once per cached call; a fork keeps a buffer of its own."""
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    prompt: list[int] = [1, 2, 3]
    for turn in range(5):
        parent = f"k{turn - 1}" if turn else ""
        builder.restore(state, {"kind": "tokens"}, f"k{turn}", prompt, [10 + turn], parent_call_id=parent)
        prompt = [*prompt, 10 + turn, 20 + turn]
    latest = state.token_calls["k4"].ids
    for turn in range(5):
        cached = state.token_calls[f"k{turn}"]
        assert cached.ids.base is latest or cached.ids is latest
        assert cached.ids.tolist() == latest.tolist()[:len(cached.ids)]
    assert state.token_calls["k0"].ids.tolist() == [1, 2, 3, 10]
    builder.restore(state, {"kind": "tokens"}, "fork", [1, 2, 99], [7])
    assert not np.shares_memory(state.token_calls["fork"].ids, latest)
    assert state.token_calls["k4"].ids is latest

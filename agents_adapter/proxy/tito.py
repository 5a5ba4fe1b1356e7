"""Token-in / token-out: prompts built from the exact token ids the engine read and wrote.

docs/architecture.md, "Bit-level trajectory consistency". Re-tokenizing a conversation's text is not
guaranteed to give back the tokens the model produced (a byte-level reply that is not valid UTF-8
decodes to U+FFFD; BPE merges differ across boundaries; templates reformat tool calls). So per session
the proxy keeps, for every served call, the ids `prompt + output` keyed by the conversation that led
to them (the request's messages plus the reply it got). A request whose messages extend such a
conversation gets the prompt

    ids(earlier prompt + output)  +  encode(glue + render(new messages) )

where `render(new messages)` is the chat template's rendering of the new messages (it ends with the
generation prompt) and `glue` closes the earlier reply the way the template closes an assistant turn. The
new messages are rendered after the reply they follow (`ChatCodec.tail_after_served`: one render, which
also tells whether the template writes that reply as the model did); where it does not, they are rendered
alone (`ChatCodec.render_tail`), which the probed convention makes the same text.

The template convention is probed at start-up, not assumed (`chat_codec`).

Drift: a request in a session that already served calls, whose messages hold assistant turns the
session cannot map to served ids (history edited, or sent after the cache forgot them), is tokenized
afresh and flagged (`BuiltPrompt.drift`); the trajectory processor forks the tree there. Assistant
turns in a session's first request are context (few-shot), not drift.

Every prompt that follows served calls is classified when it is built (`BuiltPrompt.drift_class`):
`continuation` (served ids + suffix, and the template renders the reply it extends exactly as the
model wrote it), `realigned` (served ids + suffix, but re-rendering the history would have changed
that reply's text: a think block Qwen3 drops, a call written with other spacing, a Llama 3 reply
trimmed, bytes that are not UTF-8; the served ids are kept, nothing forks,
and the count shows what re-tokenizing would have cost) or `fork` (edited history, `drift`). A prompt
with nothing served before it has no class ("").

Text (`/v1/completions`) and token (`/v1/generate`) prompts follow the same rule on their own units:
the longest served `prompt + output` that prefixes the new prompt is reused verbatim; a prompt that
starts with a served prompt but not with its output is drift.

Sessions live in an LRU cache with an idle TTL (`session_cache`); each keeps at most
`calls_cached_per_session` served calls. The cache is rebuilt from the durable session store
(`session_store`) when a session comes back after an eviction or a proxy restart (`TitoBuilder.restore`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from agents_adapter.proxy.chat_codec import ChatCodec, Message
from agents_adapter.proxy.session_cache import CachedCall, ChatChain, SessionState

# ------------------------------------------------------------------------------------- canonical form


def message_text(content: Any) -> str:
    """The text of a message's content as chat templates read it (parts' `text` concatenated)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def canonical_message(message: Message) -> bytes:
    """What of a message changes its rendering: role, text, name, tool calls (arguments as JSON values)."""
    if _plain(message) and not message.get("name"):
        # the common message, written directly: the same bytes as the json.dumps below, a tenth of its cost
        return f"[{_json_string(message['role'])},{_json_string(message['content'])},\"\",[]]".encode()
    calls = [
        [str(fn.get("name", "")), _canonical_arguments(fn.get("arguments"))]
        for call in (message.get("tool_calls") or ())
        for fn in [call.get("function", call)]
    ]
    form = [message.get("role"), message_text(message.get("content")), message.get("name") or "", calls]
    return json.dumps(form, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


#: json.dumps's string writer with ensure_ascii=False (its C version where there is one)
_json_string: Callable[[str], str] = (getattr(json.encoder, "c_encode_basestring", None)
                                      or json.encoder.encode_basestring)


def _plain(message: Message) -> bool:
    """Whether only role, text and name make the message's canonical form (text content, no tool calls): an
    equal message (`==`) then has the same form. Tool arguments compare 1 == 1.0 as Python values, not as
    the JSON they are written as: a message with tool calls is not plain."""
    role, content, name = message.get("role"), message.get("content"), message.get("name")
    return type(role) is str and type(content) is str and (name is None or type(name) is str) \
        and not message.get("tool_calls")


def _chain(seed: bytes, messages: Sequence[Message],
           previous: ChatChain | None = None) -> tuple[list[bytes], ChatChain]:
    """Hash of every prefix of `messages` (index i: messages[: i + 1]) under `seed` (the tools), and what
    the next request can reuse. The hashes of the leading messages equal to `previous`'s plain ones (the
    session's last request: an agent sends its conversation again with new turns at the end) are taken
    from it."""
    reused = 0
    if previous is not None and previous.seed == seed:
        for old, new in zip(previous.plain, messages, strict=False):
            if old != new:
                break
            reused += 1
    plain_end = reused
    while plain_end < len(messages) and _plain(messages[plain_end]):
        plain_end += 1
    out = list(previous.digests[:reused]) if previous is not None and reused else []
    digest = out[-1] if out else hashlib.blake2b(seed, digest_size=16).digest()
    for message in messages[reused:]:
        digest = hashlib.blake2b(digest + canonical_message(message), digest_size=16).digest()
        out.append(digest)
    return out, ChatChain(seed, tuple(messages[:plain_end]), tuple(out[:plain_end]))


def tools_seed(tools: Sequence[Mapping[str, Any]] | None) -> bytes:
    return json.dumps(list(tools or ()), sort_keys=True, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------------------------------------ prompts


CONTINUATION: Final = "continuation"
REALIGNED: Final = "realigned"
FORK: Final = "fork"
DRIFT_CLASSES: Final = (CONTINUATION, REALIGNED, FORK)


def drift_classes_by_agent(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{agent: {class: calls}} from (agent, class) counts, every class present (0 when none happened)."""
    out: dict[str, dict[str, int]] = {}
    for (agent, kind), n in sorted(counts.items()):
        out.setdefault(agent, dict.fromkeys(DRIFT_CLASSES, 0))[kind] = n
    return out


@dataclass(frozen=True)
class BuiltPrompt:
    """A prompt ready for the engine, and how it relates to the session's earlier calls."""

    ids: list[int]
    parent_call_id: str = ""
    drift: bool = False
    reused_tokens: int = 0
    chain_key: bytes = b""  # chat: hash of the request's messages (replies are keyed under it)
    text: str = ""  # text completions: the prompt text
    drift_class: str = ""  # CONTINUATION, REALIGNED or FORK; "" when nothing served precedes the prompt


class TitoBuilder:
    """Builds prompts from a session's served calls and remembers the calls it serves."""

    def __init__(self, codec: ChatCodec, calls_per_session: int) -> None:
        self.codec = codec
        self.calls_per_session = calls_per_session

    # ----- chat

    def chat_prompt(self, state: SessionState, messages: Sequence[Message],
                    tools: Sequence[Mapping[str, Any]] | None) -> BuiltPrompt:
        chain, state.chat_chain = _chain(tools_seed(tools), messages, state.chat_chain)
        for end in range(len(messages) - 1, -1, -1):
            if messages[end].get("role") != "assistant":
                continue
            cached = state.chat_calls.get(chain[end])
            if cached is None:
                continue
            tail = messages[end + 1 :]
            if any(m.get("role") == "assistant" for m in tail):
                break  # assistant turns after the served part were not served here: drift
            state.chat_calls.move_to_end(chain[end])
            output = self.codec.decode(cached.ids[cached.prompt_len :].tolist())
            tail_text = self.codec.tail_after_served(messages[end], output + cached.glue, tail)
            same = tail_text is not None
            if tail_text is None:
                tail_text = self.codec.render_tail(tail)
            return BuiltPrompt(cached.ids.tolist() + self.codec.encode(cached.glue + tail_text), cached.call_id,
                               False, len(cached.ids), chain[-1], drift_class=CONTINUATION if same else REALIGNED)
        has_history = any(m.get("role") == "assistant" for m in messages)
        drift = has_history and state.calls_served > 0
        return BuiltPrompt(self.codec.encode(self.codec.render(messages, tools)), "", drift, 0, chain[-1],
                           drift_class=FORK if drift else "")

    @staticmethod
    def chat_key(prompt: BuiltPrompt, reply: Message) -> bytes:
        """Where a served chat call is kept: the conversation that led to it, its reply included."""
        return hashlib.blake2b(prompt.chain_key + canonical_message(reply), digest_size=16).digest()

    def remember_chat(self, state: SessionState, prompt: BuiltPrompt, reply: Message, call_id: str,
                      output_ids: Sequence[int]) -> None:
        self.restore(state, {"kind": "chat", "key": self.chat_key(prompt, reply).hex()}, call_id, prompt.ids,
                     output_ids)

    def restore(self, state: SessionState, entry: Mapping[str, Any], call_id: str, prompt_ids: Sequence[int],
                output_ids: Sequence[int], parent_call_id: str = "") -> None:
        """Keeps a served call under `entry` ({"kind": chat|text|tokens, ...}: what `remember_*` derive, and
        what the durable session store keeps so that a session's cache survives a proxy restart).
        `parent_call_id`: the cached call whose prompt+output the prompt extends (the call's event says it)."""
        # packed ids (an event's) are read in place, not converted number by number
        ids = np.concatenate((np.asarray(prompt_ids, dtype=np.int32), np.asarray(output_ids, dtype=np.int32)))
        kind = entry["kind"]
        if parent_call_id:
            for calls in (state.chat_calls, state.text_calls, state.token_calls):
                _share(calls, parent_call_id, ids)
        if kind == "chat":
            self._keep(state.chat_calls, bytes.fromhex(entry["key"]),
                       CachedCall(call_id, ids, len(prompt_ids), glue=self.codec.glue(output_ids)))
        elif kind == "text":
            self._keep(state.text_calls, call_id, CachedCall(call_id, ids, len(prompt_ids),
                                                             prompt_text=entry["prompt_text"],
                                                             full_text=entry["full_text"]))
        else:
            self._keep(state.token_calls, call_id, CachedCall(call_id, ids, len(prompt_ids)))

    # ----- text completions

    def text_prompt(self, state: SessionState, text: str) -> BuiltPrompt:
        best: CachedCall | None = None
        drift = False
        for cached in tuple(state.text_calls.values()):  # a snapshot: this runs off the event loop
            if text.startswith(cached.full_text):
                if best is None or len(cached.full_text) > len(best.full_text):
                    best = cached
            elif text.startswith(cached.prompt_text) and len(text) > len(cached.prompt_text):
                drift = True
        if best is not None:
            suffix = self.codec.encode(text[len(best.full_text) :])
            return BuiltPrompt(best.ids.tolist() + suffix, best.call_id, False, len(best.ids), text=text,
                               drift_class=CONTINUATION)
        drift = drift and state.calls_served > 0
        return BuiltPrompt(self.codec.encode(text), "", drift, 0, text=text, drift_class=FORK if drift else "")

    def remember_text(self, state: SessionState, prompt: BuiltPrompt, served_text: str, call_id: str,
                      output_ids: Sequence[int]) -> None:
        self.restore(state, {"kind": "text", "prompt_text": prompt.text, "full_text": prompt.text + served_text},
                     call_id, prompt.ids, output_ids)

    # ----- token prompts

    def token_prompt(self, state: SessionState, input_ids: Sequence[int]) -> BuiltPrompt:
        arr = np.asarray(input_ids, dtype=np.int64)
        best: CachedCall | None = None
        drift = False
        for cached in tuple(state.token_calls.values()):  # a snapshot: this may run off the event loop
            n = len(cached.ids)
            if len(arr) >= n and np.array_equal(arr[:n], cached.ids):
                if best is None or n > len(best.ids):
                    best = cached
            elif len(arr) > cached.prompt_len and np.array_equal(arr[: cached.prompt_len],
                                                                 cached.ids[: cached.prompt_len]):
                drift = True
        if best is not None:
            return BuiltPrompt(list(input_ids), best.call_id, False, len(best.ids), drift_class=CONTINUATION)
        drift = drift and state.calls_served > 0
        return BuiltPrompt(list(input_ids), "", drift, 0, drift_class=FORK if drift else "")

    def remember_tokens(self, state: SessionState, prompt: BuiltPrompt, call_id: str,
                        output_ids: Sequence[int]) -> None:
        self.restore(state, {"kind": "tokens"}, call_id, prompt.ids, output_ids)

    def _keep(self, calls: OrderedDict[Any, CachedCall], key: Any, entry: CachedCall) -> None:
        calls[key] = entry
        calls.move_to_end(key)
        while len(calls) > self.calls_per_session:
            calls.popitem(last=False)


def _share(calls: OrderedDict[Any, CachedCall], parent_call_id: str, ids: np.ndarray) -> None:
    """The cached calls whose ids are a prefix of `ids` (a new call extending `parent_call_id`: the parent, and the
    calls whose ids are a shorter view of the parent's buffer) read them from `ids` instead: a growing session
    keeps one buffer of its latest context, not one per cached call (16 x 256 KB at 64K tokens)."""
    parent = next((c.ids for c in calls.values() if c.call_id == parent_call_id), None)
    if parent is None or len(parent) > len(ids) or not np.array_equal(ids[:len(parent)], parent):
        return  # not an extension of the cached parent after all: each call keeps its own ids
    owner = parent if parent.base is None else parent.base
    for key, cached in list(calls.items()):
        same_buffer = cached.ids is parent or cached.ids.base is owner or cached.ids is owner
        if same_buffer and len(cached.ids) <= len(parent):
            calls[key] = dataclasses.replace(cached, ids=ids[:len(cached.ids)])


def new_call_id() -> str:
    return uuid.uuid4().hex

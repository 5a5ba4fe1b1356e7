"""Token-in / token-out: prompts built from the exact token ids the engine read and wrote.

docs/architecture.md, "Bit-level trajectory consistency". Re-tokenizing a conversation's text is not
guaranteed to give back the tokens the model produced (a byte-level reply that is not valid UTF-8
decodes to U+FFFD; BPE merges differ across boundaries; templates reformat tool calls). So per session
the proxy keeps, for every served call, the ids `prompt + output` keyed by the conversation that led
to them (the request's messages plus the reply it got). A request whose messages extend such a
conversation gets the prompt

    ids(earlier prompt + output)  +  encode(glue + render(new messages) )

where `render(new messages)` is the chat template applied to the new messages alone (it ends with the
generation prompt) and `glue` closes the earlier reply the way the template closes an assistant turn.

The template convention is probed, not assumed (`ChatCodec.convention`): rendering
[system, user] + [assistant A] + [next messages] must equal render([system, user], generation prompt)
+ A + CLOSE + render([next messages]) for tool and non-tool turns, with and without tools; CLOSE is
what the template writes after a reply ("<|im_end|>\\n" for ChatML). The engine's output of a reply that
stopped on <|im_end|> already holds that token, so its glue is the rest of CLOSE ("\\n"); a reply cut by
max_tokens gets all of CLOSE. A template that cannot be split this way is refused at start-up
(`TemplateError`) rather than producing prompts that differ from what the template would give.

Drift: a request in a session that already served calls, whose messages hold assistant turns the
session cannot map to served ids (history edited, or sent after the cache forgot them), is tokenized
afresh and flagged (`BuiltPrompt.drift`); the trajectory processor forks the tree there. Assistant
turns in a session's first request are context (few-shot), not drift.

Text (`/v1/completions`) and token (`/v1/generate`) prompts follow the same rule on their own units:
the longest served `prompt + output` that prefixes the new prompt is reused verbatim; a prompt that
starts with a served prompt but not with its output is drift.

Sessions live in an LRU cache with an idle TTL (`SessionCache`); each keeps at most
`calls_cached_per_session` served calls. The cache is rebuilt from the durable session store
(`session_store`) when a session comes back after an eviction or a proxy restart (`TitoBuilder.restore`).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from agents_adapter.errors import TemplateError
from schemas.inference.byte_level import bytes_to_unicode

Message = Mapping[str, Any]
_PROBE_SYSTEM: Final = "PROBE-SYSTEM"
_PROBE_USER: Final = "PROBE-USER"
_PROBE_REPLY: Final = "PROBE-REPLY"
_PROBE_NEXT: Final = "PROBE-NEXT"
_PROBE_TOOLS: Final = (
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    },
)
_PROBE_CALL: Final = {
    "id": "call_probe",
    "type": "function",
    "function": {"name": "probe_tool", "arguments": '{"x": "1"}'},
}


# --------------------------------------------------------------------------------------------- codec


@dataclass(frozen=True)
class TemplateConvention:
    """How the chat template closes an assistant turn and opens the next one."""

    turn_close: str
    generation_prompt: str


class ChatCodec:
    """The model's tokenizer and chat template, plus the probed template convention."""

    def __init__(self, tokenizer: Any, eos_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.vocab_size = len(tokenizer)
        self.convention = self._probe()
        self._close_prefixes = {
            tok: self.convention.turn_close[len(text) :]
            for tok in self.eos_token_ids
            if (text := self.decode([tok])) and self.convention.turn_close.startswith(text)
        }
        self._byte_decoder = _byte_level_decoder(tokenizer)
        self._special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_model_dir(cls, path: Path) -> ChatCodec:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as e:
            raise TemplateError(f"model_path={str(path)!r}: cannot load its tokenizer: {e}") from e
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"model_path={str(path)!r}: the tokenizer has no chat template")
        return cls(tokenizer, _eos_ids(path, tokenizer))

    # ----- text <-> ids

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
               *, add_generation_prompt: bool = True) -> str:
        if not messages:
            return self.convention.generation_prompt if add_generation_prompt else ""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, tokenize=False,
            )
        except Exception as e:  # jinja raises its own error types (raise_exception in templates)
            raise TemplateError(f"the chat template failed on these messages: {e}") from e
        return str(text)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:  # encode_batch releases the GIL (encode does not): other threads run
            return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (OpenAI logprobs `bytes`); exact for byte-level vocabularies."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        decoder = self._byte_decoder
        if (decoder is not None and token_id not in self._special_ids and isinstance(piece, str) and piece
                and all(c in decoder for c in piece)):
            return bytes(decoder[c] for c in piece)
        return self.decode([token_id]).encode("utf-8")

    def glue(self, output_ids: Sequence[int]) -> str:
        """Text between a served output and the messages that follow it (closes the assistant turn)."""
        if output_ids and output_ids[-1] in self._close_prefixes:
            return self._close_prefixes[output_ids[-1]]
        return self.convention.turn_close

    def render_tail(self, messages: Sequence[Message]) -> str:
        """The new messages of an extended conversation, rendered alone, with the generation prompt.

        A leading system message is rendered after a throw-away user turn: templates treat a system
        message at position 0 as the conversation header (tools block), which it is not here.
        """
        if messages and messages[0].get("role") == "system":
            anchor = [{"role": "user", "content": _PROBE_USER}]
            head = self.render(anchor, add_generation_prompt=False)
            full = self.render([*anchor, *messages])
            if not full.startswith(head):
                raise TemplateError("the chat template renders a system message differently after a user turn")
            return full[len(head) :]
        return self.render(messages)

    # ----- probe

    def _probe(self) -> TemplateConvention:
        """Derives turn_close and the generation prompt, and checks the split holds (see module doc)."""
        user = {"role": "user", "content": _PROBE_USER}
        nxt = {"role": "user", "content": _PROBE_NEXT}
        gen_prompt = self._strip_prefix(self.render([nxt]), self.render([nxt], add_generation_prompt=False),
                                        "the generation prompt is not appended at the end")
        reply = {"role": "assistant", "content": _PROBE_REPLY}
        head = self.render([{"role": "system", "content": _PROBE_SYSTEM}, user])
        full = self.render([{"role": "system", "content": _PROBE_SYSTEM}, user, reply, nxt])
        tail = self.render([nxt])
        start = head + _PROBE_REPLY
        if not full.startswith(start) or not full.endswith(tail) or len(full) < len(start) + len(tail):
            raise TemplateError(
                "the chat template does not render [system, user, assistant, user] as "
                "render([system, user]) + reply + close + render([user]): no token-in/token-out with it"
            )
        convention = TemplateConvention(full[len(start) : len(full) - len(tail)], gen_prompt)
        self.convention = convention
        tool_reply = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
        tool_result = {"role": "tool", "tool_call_id": "call_probe", "content": "PROBE-RESULT"}
        cases: list[tuple[list[Message], Any, list[Message], list[Message]]] = [
            ([user], None, [reply], [nxt]),
            ([user], _PROBE_TOOLS, [tool_reply], [tool_result]),
            ([{"role": "system", "content": _PROBE_SYSTEM}, user], _PROBE_TOOLS, [tool_reply],
             [tool_result, {**tool_result, "content": "PROBE-RESULT-2"}]),
            ([user], _PROBE_TOOLS, [reply], [{"role": "system", "content": _PROBE_SYSTEM}, nxt]),
        ]
        for prompt, tools, replies, following in cases:
            head = self.render(prompt, tools)
            full = self.render([*prompt, *replies, *following], tools)
            expected_tail = convention.turn_close + self.render_tail(following)
            if not (full.startswith(head) and full.endswith(expected_tail)):
                roles = [m["role"] for m in [*prompt, *replies, *following]]
                raise TemplateError(
                    f"the chat template does not split at the assistant turn for roles {roles} "
                    f"(tools={'yes' if tools else 'no'}): no token-in/token-out with it"
                )
        return convention

    @staticmethod
    def _strip_prefix(text: str, prefix: str, problem: str) -> str:
        if not text.startswith(prefix):
            raise TemplateError(f"chat template: {problem}")
        return text[len(prefix) :]


def _eos_ids(path: Path, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((path / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def _byte_level_decoder(tokenizer: Any) -> dict[str, int] | None:
    """char -> byte map when the vocabulary is byte-level BPE (GPT-2 / Qwen style), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or "ByteLevel" not in type(getattr(backend, "decoder", None)).__name__ + repr(
        getattr(backend, "decoder", None)
    ):
        return None
    return {char: byte for byte, char in bytes_to_unicode().items()}


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
    calls = [
        [str(fn.get("name", "")), _canonical_arguments(fn.get("arguments"))]
        for call in (message.get("tool_calls") or ())
        for fn in [call.get("function", call)]
    ]
    form = [message.get("role"), message_text(message.get("content")), message.get("name") or "", calls]
    return json.dumps(form, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _chain(seed: bytes, messages: Sequence[Message]) -> list[bytes]:
    """Hash of every prefix of `messages` (index i: messages[: i + 1]) under `seed` (the tools)."""
    out: list[bytes] = []
    digest = hashlib.blake2b(seed, digest_size=16).digest()
    for message in messages:
        digest = hashlib.blake2b(digest + canonical_message(message), digest_size=16).digest()
        out.append(digest)
    return out


def tools_seed(tools: Sequence[Mapping[str, Any]] | None) -> bytes:
    return json.dumps(list(tools or ()), sort_keys=True, separators=(",", ":")).encode("utf-8")


# ----------------------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class CachedCall:
    """A served call as the engine saw it: `ids` = prompt + output (int32)."""

    call_id: str
    ids: np.ndarray
    prompt_len: int
    glue: str = ""  # chat: what closes the reply before the next messages
    prompt_text: str = ""  # text completions: the prompt and prompt + served text
    full_text: str = ""


@dataclass
class SessionState:
    """One agent session: who owns it, its lifecycle, and the served calls kept for token-in/token-out."""

    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    phase: str = "open"  # open -> awaiting_reward (ended, reward to come) -> ended
    started_recorded: bool = False
    calls_served: int = 0
    next_turn: int = 0
    drift_calls: int = 0
    reward: float | None = None
    chat_calls: OrderedDict[bytes, CachedCall] = field(default_factory=OrderedDict)
    text_calls: OrderedDict[str, CachedCall] = field(default_factory=OrderedDict)
    token_calls: OrderedDict[str, CachedCall] = field(default_factory=OrderedDict)
    last_used: float = 0.0


class SessionCache:
    """Sessions by id: least recently used beyond `max_sessions`, forgotten after `ttl_s` idle."""

    def __init__(self, max_sessions: int, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[SessionState, str], None] | None = None) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_evict = on_evict
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.evicted_lru = 0
        self.expired_ttl = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> SessionState | None:
        state = self._sessions.get(session_id)
        if state is None:
            return None
        now = self._clock()
        if now - state.last_used > self.ttl_s:
            self._drop(session_id, "ttl")
            return None
        state.last_used = now
        self._sessions.move_to_end(session_id)
        return state

    def get_or_create(self, session_id: str, create: Callable[[], SessionState]) -> tuple[SessionState, bool]:
        state = self.get(session_id)
        if state is not None:
            return state, False
        state = create()
        state.last_used = self._clock()
        self._sessions[session_id] = state
        self.sweep()
        while len(self._sessions) > self.max_sessions:
            self._drop(next(iter(self._sessions)), "lru")
        return state, True

    def sweep(self) -> int:
        """Forgets sessions idle longer than the TTL (oldest first); returns how many."""
        now = self._clock()
        expired = 0
        while self._sessions:
            sid, state = next(iter(self._sessions.items()))
            if now - state.last_used <= self.ttl_s:
                break
            self._drop(sid, "ttl")
            expired += 1
        return expired

    def _drop(self, session_id: str, why: str) -> None:
        state = self._sessions.pop(session_id)
        if why == "ttl":
            self.expired_ttl += 1
        else:
            self.evicted_lru += 1
        if self._on_evict is not None:
            self._on_evict(state, why)


# ------------------------------------------------------------------------------------------ prompts


@dataclass(frozen=True)
class BuiltPrompt:
    """A prompt ready for the engine, and how it relates to the session's earlier calls."""

    ids: list[int]
    parent_call_id: str = ""
    drift: bool = False
    reused_tokens: int = 0
    chain_key: bytes = b""  # chat: hash of the request's messages (replies are keyed under it)
    text: str = ""  # text completions: the prompt text


class TitoBuilder:
    """Builds prompts from a session's served calls and remembers the calls it serves."""

    def __init__(self, codec: ChatCodec, calls_per_session: int) -> None:
        self.codec = codec
        self.calls_per_session = calls_per_session

    # ----- chat

    def chat_prompt(self, state: SessionState, messages: Sequence[Message],
                    tools: Sequence[Mapping[str, Any]] | None) -> BuiltPrompt:
        chain = _chain(tools_seed(tools), messages)
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
            suffix = self.codec.encode(cached.glue + self.codec.render_tail(tail))
            return BuiltPrompt(cached.ids.tolist() + suffix, cached.call_id, False, len(cached.ids), chain[-1])
        has_history = any(m.get("role") == "assistant" for m in messages)
        drift = has_history and state.calls_served > 0
        return BuiltPrompt(self.codec.encode(self.codec.render(messages, tools)), "", drift, 0, chain[-1])

    @staticmethod
    def chat_key(prompt: BuiltPrompt, reply: Message) -> bytes:
        """Where a served chat call is kept: the conversation that led to it, its reply included."""
        return hashlib.blake2b(prompt.chain_key + canonical_message(reply), digest_size=16).digest()

    def remember_chat(self, state: SessionState, prompt: BuiltPrompt, reply: Message, call_id: str,
                      output_ids: Sequence[int]) -> None:
        self.restore(state, {"kind": "chat", "key": self.chat_key(prompt, reply).hex()}, call_id, prompt.ids,
                     output_ids)

    def restore(self, state: SessionState, entry: Mapping[str, Any], call_id: str, prompt_ids: Sequence[int],
                output_ids: Sequence[int]) -> None:
        """Keeps a served call under `entry` ({"kind": chat|text|tokens, ...}: what `remember_*` derive, and
        what the durable session store keeps so that a session's cache survives a proxy restart)."""
        ids = np.asarray([*prompt_ids, *output_ids], dtype=np.int32)
        kind = entry["kind"]
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
            return BuiltPrompt(best.ids.tolist() + suffix, best.call_id, False, len(best.ids), text=text)
        return BuiltPrompt(self.codec.encode(text), "", drift and state.calls_served > 0, 0, text=text)

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
            return BuiltPrompt(list(input_ids), best.call_id, False, len(best.ids))
        return BuiltPrompt(list(input_ids), "", drift and state.calls_served > 0, 0)

    def remember_tokens(self, state: SessionState, prompt: BuiltPrompt, call_id: str,
                        output_ids: Sequence[int]) -> None:
        self.restore(state, {"kind": "tokens"}, call_id, prompt.ids, output_ids)

    def _keep(self, calls: OrderedDict[Any, CachedCall], key: Any, entry: CachedCall) -> None:
        calls[key] = entry
        calls.move_to_end(key)
        while len(calls) > self.calls_per_session:
            calls.popitem(last=False)


def new_call_id() -> str:
    return uuid.uuid4().hex

"""Prompts recorded by reference: an `LLMCall` whose prompt begins with an earlier call's prompt+output.

A session's calls mostly extend the previous call's prompt+output with a tool output (token-in/token-out), so
the proxy records such a call by reference (`by_reference`): `prompt_base_call_id` names the earlier call,
`prompt_base_len` how many of that call's prompt+output ids begin this prompt (all of them for an extension;
fewer for a fork, e.g. an agent that rewrote its history), and `prompt_ids` holds only the ids after them. A
session of T calls growing to L tokens then puts O(L) ids on `llm.calls`, not O(T*L).

Readers see the calls as before: `resolved` puts the whole prompt back (the call in full form, equal to
what recording it in full gives), from the base call's ids. `PromptResolver` is the reader's side for readers
with no state of their own (replay tools, sinks, tails): it keeps, per session, the ids of the calls it
resolved, in buffers shared along a chain of extensions (a linear session holds one buffer of its latest
context, not one per call). A reference to a call the reader has not seen (a read that starts mid-session, a
parent beyond what is kept) raises `UnresolvedPromptError` naming both calls: the reader dead-letters or
reports it, never guesses. A call in full form (every call of the schema's earlier versions: their upcast
fills `prompt_base_call_id=''`) resolves to itself.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from schemas.errors import SchemaError
from schemas.packed import Int32s
from schemas.rollout_events import LLMCall

_ID_BYTES = 4  # packed int32


class UnresolvedPromptError(SchemaError):
    """A call refers to a base call the reader does not hold (or holds fewer ids of than it needs)."""


def by_reference(call: LLMCall, base_call_id: str, base_len: int) -> LLMCall:
    """`call` (in full form) recorded by reference: its first `base_len` prompt ids are `base_call_id`'s
    prompt+output ids, which the caller has checked; `prompt_ids` keeps the rest."""
    if call.by_reference:
        raise ValueError(f"call {call.call_id!r} is already recorded by reference")
    if not 0 < base_len <= len(call.prompt_ids):
        raise ValueError(f"base_len={base_len} outside (0, {len(call.prompt_ids)}] for call {call.call_id!r}")
    rest = Int32s(call.prompt_ids.to_bytes()[base_len * _ID_BYTES:])
    return dataclasses.replace(call, prompt_ids=rest, prompt_base_call_id=base_call_id, prompt_base_len=base_len)


def resolved(call: LLMCall, base_ids: bytes) -> LLMCall:
    """`call` in full form, `base_ids` being its base call's prompt+output ids (packed int32)."""
    if not call.by_reference:
        return call
    need = call.prompt_base_len * _ID_BYTES
    if len(base_ids) < need:
        raise UnresolvedPromptError(
            f"call {call.call_id!r} takes {call.prompt_base_len} ids of call {call.prompt_base_call_id!r}, "
            f"which has {len(base_ids) // _ID_BYTES}")
    prompt = Int32s(base_ids[:need] + call.prompt_ids.to_bytes())
    return dataclasses.replace(call, prompt_ids=prompt, prompt_base_call_id="", prompt_base_len=0)


@dataclass
class _Held:
    """A resolved call's prompt+output: the first `length` bytes of `buffer` (a buffer its extensions share)."""

    buffer: bytes
    length: int


class PromptResolver:
    """Resolves references for a reader of `llm.calls` that holds no session state of its own (module doc).

    Per session it keeps the `calls_per_session` calls it saw or resolved a reference to last (least recently
    used beyond, as the proxy's token-in/token-out cache, whose calls are what a reference names:
    `calls_cached_per_session`, 16 by default), and at
    most `max_sessions` sessions (least recently used beyond). `forget` drops a session (its end).
    """

    def __init__(self, calls_per_session: int = 64, max_sessions: int = 100_000) -> None:
        if calls_per_session < 1 or max_sessions < 1:
            raise ValueError(f"calls_per_session={calls_per_session} and max_sessions={max_sessions} must be >= 1")
        self.calls_per_session = calls_per_session
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, OrderedDict[str, _Held]] = OrderedDict()

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def resolve(self, call: LLMCall) -> LLMCall:
        """`call` in full form; remembers it for the calls that refer to it. Raises UnresolvedPromptError."""
        held = self._sessions.get(call.session_id)
        if not call.by_reference:
            self._remember(call, None)
            return call
        base = None if held is None else held.get(call.prompt_base_call_id)
        if held is None or base is None:
            raise UnresolvedPromptError(
                f"call {call.call_id!r} of session {call.session_id!r} refers to call "
                f"{call.prompt_base_call_id!r}, which this reader has not seen")
        held.move_to_end(call.prompt_base_call_id)  # used: kept longer, as the proxy's cache keeps it
        full = resolved(call, base.buffer[:base.length])
        # the call extends its base's whole buffer: the buffer's holders can read the call's instead
        extends = base.buffer if base.length == len(base.buffer) == call.prompt_base_len * _ID_BYTES else None
        self._remember(full, extends)
        return full

    def _remember(self, call: LLMCall, extends: bytes | None) -> None:
        ids = call.prompt_ids.to_bytes() + call.output_ids.to_bytes()
        calls = self._sessions.get(call.session_id)
        if calls is None:
            calls = self._sessions[call.session_id] = OrderedDict()
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(call.session_id)
        if extends is not None:
            for other in calls.values():
                if other.buffer is extends:
                    other.buffer = ids
        calls[call.call_id] = _Held(ids, len(ids))
        calls.move_to_end(call.call_id)
        while len(calls) > self.calls_per_session:
            calls.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


def reference_form(call: LLMCall, earlier: Sequence[LLMCall]) -> LLMCall:
    """`call` (full form) by reference to the one of `earlier` (full form, same session) whose prompt+output
    shares the longest prefix with its prompt: an extension takes all of that call's ids, a fork (an agent that
    rewrote its history) those up to the fork point. In full form when none shares a first id. The proxy does
    not need this search (token-in/token-out knows the parent); a writer that does not know it (a recorded
    session converted, an agent library recording its own calls) does."""
    best_id, best_len = longest_shared(
        call, ((base.call_id, np.concatenate((np.asarray(base.prompt_ids), np.asarray(base.output_ids))))
               for base in earlier))
    return by_reference(call, best_id, best_len) if best_len else call


def longest_shared(call: LLMCall, candidates: Iterable[tuple[str, np.ndarray]]) -> tuple[str, int]:
    """Of (call id, prompt+output ids) candidates, the one sharing the longest prefix with `call`'s prompt, and
    that length (('', 0) when none shares a first id)."""
    prompt = np.asarray(call.prompt_ids)
    best_id, best_len = "", 0
    for call_id, ids in candidates:
        n = min(len(ids), len(prompt))
        differ = np.flatnonzero(ids[:n] != prompt[:n])
        shared = int(differ[0]) if len(differ) else n
        if shared > best_len:
            best_id, best_len = call_id, shared
    return best_id, best_len

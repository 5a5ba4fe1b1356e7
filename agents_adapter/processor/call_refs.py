"""The processor's side of prompts recorded by reference (`schemas.prompt_refs`): resolved against the session.

The processor needs no `PromptResolver`: the session's tree holds every call it merged (and is rebuilt from the
table after a restart), so a base call is read from it (the last merged call from the session's copy of its ids,
without walking the tree). A base the session does not hold rejects the call (dead-lettered with the reason).
"""

from __future__ import annotations

from collections.abc import Callable

from agents_adapter.errors import UnknownCallError, UnresolvedCallError
from schemas.events import LLMCall
from schemas.prompt_refs import UnresolvedPromptError, resolved


def in_full_form(ids_of: Callable[[str], bytes], call: LLMCall) -> tuple[LLMCall, str]:
    """The call in full form, and the call it extends whole ('' when none: a fork or a call in full form);
    `ids_of(call_id)` gives a merged call's prompt+output ids (packed) or raises UnknownCallError."""
    if not call.by_reference:
        return call, ""
    try:
        base = ids_of(call.prompt_base_call_id)
        full = resolved(call, base)
    except UnknownCallError:
        raise UnresolvedCallError(f"call {call.call_id!r} refers to call {call.prompt_base_call_id!r}, which "
                                  f"session {call.session_id!r} does not hold") from None
    except UnresolvedPromptError as e:
        raise UnresolvedCallError(str(e)) from None
    return full, call.prompt_base_call_id if call.prompt_base_len * 4 == len(base) else ""

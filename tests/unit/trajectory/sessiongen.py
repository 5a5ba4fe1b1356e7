"""Random agent sessions for the trajectory tests, and a brute-force oracle of the merge rule.

Sessions use a tiny vocabulary so that unrelated calls share prefixes by accident and forks land
inside nodes: that is where a radix tree goes wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from hypothesis import strategies as st

from schemas.events import LLMCall

VOCAB = 5
tokens = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=6)
# float32-representable logprobs, -0.0 included to exercise the total order of float bits
logprobs = st.one_of(st.integers(-64, 0).map(lambda k: k / 8), st.just(-0.0))
versions = st.integers(0, 3)


def make_call(
    call_id: str,
    prompt: Sequence[int],
    output: Sequence[int],
    lps: Sequence[float] | None = None,
    vers: Sequence[int] | None = None,
    *,
    session_id: str = "s1",
    group_id: str = "g1",
    ts_ms: int = 1_000,
    turn: int = 0,
    drift: bool = False,
) -> LLMCall:
    return LLMCall(
        event_id=f"ev-{call_id}",
        ts_ms=ts_ms,
        producer="adapter-0",
        correlation_id=session_id,
        call_id=call_id,
        session_id=session_id,
        agent_id="agent-1",
        task_id="task-1",
        group_id=group_id,
        model="toy",
        turn=turn,
        prompt_ids=tuple(prompt),
        output_ids=tuple(output),
        output_logprobs=tuple(lps) if lps is not None else tuple(-0.5 for _ in output),
        output_versions=tuple(vers) if vers is not None else tuple(1 for _ in output),
        finish_reason="stop",
        request_ms=ts_ms - 10,
        completed_ms=ts_ms,
        drift=drift,
    )


@st.composite
def sessions(draw: st.DrawFn, max_turns: int = 7, session_id: str = "s1") -> list[LLMCall]:
    """Multi-turn calls: turn k+1's prompt = turn k's prompt + output + new given tokens; some calls
    fork from an earlier call with edited history (the session then continues on the fork), some
    re-sample an earlier prompt (retries may re-generate the same tokens with other versions)."""
    calls: list[LLMCall] = []
    history = draw(tokens)
    for turn in range(draw(st.integers(1, max_turns))):
        kind = draw(st.sampled_from(["extend", "extend", "extend", "fork", "retry"])) if calls else "extend"
        if kind == "fork":
            base = draw(st.sampled_from(calls))
            full = list(base.prompt_ids) + list(base.output_ids)
            prompt = full[: draw(st.integers(0, len(full)))] + draw(tokens)
        elif kind == "retry":
            prompt = list(draw(st.sampled_from(calls)).prompt_ids)
        else:
            prompt = history
        output = draw(tokens)
        lps = [draw(logprobs) for _ in output]
        vers = [draw(versions) for _ in output]
        call = make_call(f"{session_id}-c{turn}", prompt, output, lps, vers, session_id=session_id,
                         ts_ms=1_000 + 10 * turn, turn=turn, drift=kind == "fork")
        calls.append(call)
        history = prompt + output + draw(tokens)
    return calls


def _float_key(x: float) -> int:
    bits = struct.unpack("<i", struct.pack("<f", x))[0]
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def oracle(calls: Sequence[LLMCall]) -> dict[tuple[int, ...], tuple[int, int, float]]:
    """Merged (mask, version, logprob) of every distinct prefix: the max claim over the calls."""
    best: dict[tuple[int, ...], tuple[int, int, float]] = {}
    for call in calls:
        seq = list(call.prompt_ids) + list(call.output_ids)
        n_prompt = len(call.prompt_ids)
        for i in range(len(seq)):
            if i < n_prompt:
                claim = (0, -1, 0.0)
            else:
                lp = struct.unpack("<f", struct.pack("<f", call.output_logprobs[i - n_prompt]))[0]
                claim = (1, call.output_versions[i - n_prompt], lp)
            key = tuple(seq[: i + 1])
            old = best.get(key)
            if old is None or (claim[0], claim[1], _float_key(claim[2])) > (old[0], old[1], _float_key(old[2])):
                best[key] = claim
    return best

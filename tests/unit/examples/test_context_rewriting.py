"""The context-compacting agent's policy: what it keeps, and that its rewrites fork where the proxy can see it."""

from __future__ import annotations

import pytest

from examples.context_rewriting.agent import ContextCompactor

pytestmark = pytest.mark.unit


def history(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task\nmore"}]
    for t in range(turns):
        messages += [{"role": "assistant", "content": f"reply {t}"}, {"role": "user", "content": f"out {t}\nrest"}]
    return messages


def test_a_rewrite_keeps_the_system_prompt_a_summary_and_the_last_turns() -> None:
    before = history(5)[:-1]  # ends with the model's reply, as the agent rewrites it
    rewritten = ContextCompactor(every=3, keep_turns=2).rewrite(before)
    assert rewritten[0] == {"role": "system", "content": "sys"}
    assert rewritten[1] == {"role": "user", "content": "[context compacted: 6 earlier messages] task | out 0 | out 1"}
    assert rewritten[2:] == before[-4:]  # the last two turns, verbatim


def test_nothing_to_drop_leaves_the_history_as_it_is_and_rewrites_come_every_n_turns() -> None:
    compactor = ContextCompactor(every=3, keep_turns=4)
    assert compactor.rewrite(history(2)[:-1]) == history(2)[:-1]
    assert ContextCompactor(every=1, keep_turns=0).rewrite(history(1)[:-1])[1:] == [
        {"role": "user", "content": "[context compacted: 2 earlier messages] task"}]
    assert [t for t in range(10) if compactor.due(t)] == [3, 6, 9]
    with pytest.raises(ValueError, match="every=0"):
        ContextCompactor(every=0)

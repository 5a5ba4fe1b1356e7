"""How an SDK session ends when its block does not finish: a failure is the agent's, a cut-off is not."""

from __future__ import annotations

import asyncio

import pytest

from agents_adapter.sdk import AsyncAgentSession

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("exc", "status"), [(RuntimeError("agent crashed"), "failed"),
                                             (asyncio.CancelledError(), "aborted"), (KeyboardInterrupt(), "aborted"),
                                             (SystemExit(0), "aborted"), (None, "completed")])
def test_a_cancelled_session_ends_aborted_and_a_crashed_one_failed(exc: BaseException | None, status: str) -> None:
    """A worker that stops cancels its sessions mid-episode: ended `failed` with reward 0, the run counted
    them as the policy's reward and the trainer trained on them (it skips only `aborted`)."""
    session = AsyncAgentSession("http://127.0.0.1:9/v1", "key", session_id="s1")
    session.reward = 0.5 if exc is None else None
    path, body = session._end_request(exc)
    assert path == "/sessions/s1/end" and body["status"] == status
    assert body["reward"] == (0.5 if exc is None else 0.0)

"""Agent SDK: a session with the capture proxy over the official `openai` client.

    with AgentSession(base_url, api_key, task_id="t1", group_id="g1") as session:
        reply = session.client.chat.completions.create(model=..., messages=...)
        session.reward = verify(reply)        # reported on exit (status completed)
    # an exception inside the block ends the session with status failed (reward 0 unless set);
    # a block cut off from outside (cancelled: its worker stopping) ends it aborted, its reward meaningless

`session.client` is an ordinary `openai.OpenAI` whose every request carries the session headers
(X-Session-Id, X-Task-Id, X-Group-Id), so any agent code that takes an OpenAI client works unchanged.
A reward that is only known later (an external verifier): leave `reward` None; the session ends
waiting for it, and `report_reward` (or `report_reward_later(base_url, key, session_id, reward)`) sends it.
`AsyncAgentSession` is the same over `openai.AsyncOpenAI` (`async with`).

An agent fleet running many sessions passes one `http_client` (`openai.DefaultAsyncHttpxClient()`, or
the sync one) to all of them and closes it itself: a client of its own per session builds an SSL
context and opens fresh connections each time, which took 70 % of a rollout worker's CPU at five
sessions a second (py-spy, the demo), so the worker started sessions slower than the engines ran them.

A proxy restart costs no episode: every request (the chat calls, not only the end) is retried with
the client's own backoff (0.5 s doubling to 8 s) for at least `retry_budget_s` (default 60 s, about
what a proxy restart takes), on connection errors, timeouts and 5xx. A retry is safe: the client sends
an `Idempotency-Key` per request, the same on each of its retries, and the proxy answers a retry of a
call it already recorded with that call (from its durable session store) instead of sampling a second
one, so a session's tree never holds two copies of one turn; ends and rewards are idempotent too.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Generic, TypeVar

import openai

logger = logging.getLogger(__name__)
IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRY_BUDGET_S = 60.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S, _BACKOFF_MIN_JITTER = 0.5, 8.0, 0.75  # openai's retry backoff
#: What stops a session's block from outside: its worker cancelled it or is shutting down. The agent did not
#: fail, it was cut off, so the session ends `aborted` (the trainer skips it, the run's rewards leave it out):
#: ended `failed`, the sessions a run's stop cut off were counted as the last versions' reward 0.
CUT_OFF = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)


def retries_covering(budget_s: float) -> int:
    """How many retries the openai client needs to keep trying for at least `budget_s` (its shortest waits)."""
    if budget_s < 0:
        raise ValueError(f"retry_budget_s={budget_s} must be >= 0")
    retries, waited = 0, 0.0
    while waited < budget_s:
        waited += _BACKOFF_MIN_JITTER * min(_BACKOFF_FIRST_S * 2**retries, _BACKOFF_MAX_S)
        retries += 1
    return retries


class _IdempotencyKeys:
    """Makes an openai client send an idempotency key (one per request, kept across its retries)."""

    _idempotency_header: str | None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._idempotency_header = IDEMPOTENCY_HEADER  # None in openai's client: no key is sent


class _IdempotentClient(_IdempotencyKeys, openai.OpenAI):
    pass


class _AsyncIdempotentClient(_IdempotencyKeys, openai.AsyncOpenAI):
    pass


def session_headers(session_id: str, task_id: str = "", group_id: str = "") -> dict[str, str]:
    headers = {"X-Session-Id": session_id}
    if task_id:
        headers["X-Task-Id"] = task_id
    if group_id:
        headers["X-Group-Id"] = group_id
    return headers


def _reward_request(session_id: str, reward: float, status: str | None) -> tuple[str, dict[str, Any]]:
    return f"/sessions/{session_id}/reward", {"reward": reward} | ({"status": status} if status else {})


_Client = TypeVar("_Client", openai.OpenAI, openai.AsyncOpenAI)


class _SessionBase(Generic[_Client]):
    """What a session is and sends; the sync and async sessions differ only in how they send it."""

    _client_class: type[_Client]

    def __init__(self, base_url: str, api_key: str, *, session_id: str | None = None, task_id: str = "",
                 group_id: str = "", timeout_s: float = 600.0, max_retries: int | None = None,
                 end_max_retries: int | None = None, retry_budget_s: float = RETRY_BUDGET_S,
                 http_client: Any = None) -> None:
        self.session_id = session_id or f"s-{uuid.uuid4().hex}"
        self.task_id = task_id
        self.group_id = group_id
        self.reward: float | None = None
        self.status = "completed"
        self.ended: dict[str, Any] | None = None
        covering = retries_covering(retry_budget_s)
        self.max_retries = covering if max_retries is None else max_retries
        # Ending a session is what makes its trajectory exist (even a failed one, so its task group
        # completes): it is retried through a restart even when the calls were told not to retry.
        self.end_max_retries = covering if end_max_retries is None else end_max_retries
        self.client: _Client = self._client_class(base_url=base_url, api_key=api_key, default_headers=self.headers,
                                                  timeout=timeout_s, max_retries=self.max_retries,
                                                  http_client=http_client)
        self.owns_http_client = http_client is None  # a shared one is closed by whoever passed it

    @property
    def headers(self) -> dict[str, str]:
        return session_headers(self.session_id, self.task_id, self.group_id)

    def _end_request(self, exc: BaseException | None) -> tuple[str, dict[str, Any]]:
        if exc is not None:
            status = "aborted" if isinstance(exc, CUT_OFF) else "failed"
            return f"/sessions/{self.session_id}/end", {"reward": self.reward or 0.0, "status": status}
        return f"/sessions/{self.session_id}/end", {"reward": self.reward, "status": self.status}

    def _end_with(self, reward: float | None, status: str) -> tuple[str, dict[str, Any]]:
        self.reward, self.status = reward, status
        return self._end_request(None)

    def _sender(self, max_retries: int | None) -> _Client:
        return self.client if max_retries is None else self.client.with_options(max_retries=max_retries)

    def _answered(self, path: str, result: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/end"):
            self.ended = result
        return result

    def _end_failed(self, exc: BaseException | None, error: openai.OpenAIError) -> None:
        """Ending on exit failed: raised if the block went well, else logged (the block's exception is
        the one that propagates)."""
        if exc is None:
            raise error
        logger.exception("could not end session %s after a failure", self.session_id)


class AgentSession(_SessionBase[openai.OpenAI]):
    """A session over `openai.OpenAI` (see the module doc)."""

    _client_class = _IdempotentClient

    def end(self, reward: float | None = None, status: str = "completed") -> dict[str, Any]:
        """Ends the session now (reward None: the reward comes later through `report_reward`)."""
        return self._post(*self._end_with(reward, status))

    def report_reward(self, reward: float, status: str | None = None) -> dict[str, Any]:
        return self._post(*_reward_request(self.session_id, reward, status))

    def _post(self, path: str, body: dict[str, Any], max_retries: int | None = None) -> dict[str, Any]:
        return self._answered(path, self._sender(max_retries).post(path, body=body, cast_to=dict))

    def close(self) -> None:
        if self.owns_http_client:
            self.client.close()

    def __enter__(self) -> AgentSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self.ended is None:
                try:
                    self._post(*self._end_request(exc), max_retries=self.end_max_retries)
                except openai.OpenAIError as error:
                    self._end_failed(exc, error)
        finally:
            self.close()


class AsyncAgentSession(_SessionBase[openai.AsyncOpenAI]):
    """A session over `openai.AsyncOpenAI` (`async with`)."""

    _client_class = _AsyncIdempotentClient

    async def end(self, reward: float | None = None, status: str = "completed") -> dict[str, Any]:
        return await self._post(*self._end_with(reward, status))

    async def report_reward(self, reward: float, status: str | None = None) -> dict[str, Any]:
        return await self._post(*_reward_request(self.session_id, reward, status))

    async def _post(self, path: str, body: dict[str, Any], max_retries: int | None = None) -> dict[str, Any]:
        return self._answered(path, await self._sender(max_retries).post(path, body=body, cast_to=dict))

    async def __aenter__(self) -> AsyncAgentSession:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self.ended is None:
                try:
                    await self._post(*self._end_request(exc), max_retries=self.end_max_retries)
                except openai.OpenAIError as error:
                    self._end_failed(exc, error)
        finally:
            if self.owns_http_client:
                await self.client.close()


def report_reward_later(base_url: str, api_key: str, session_id: str, reward: float,
                        status: str | None = None) -> dict[str, Any]:
    """The reward of a session that ended without one (e.g. from a verifier in another process)."""
    path, body = _reward_request(session_id, reward, status)
    with _IdempotentClient(base_url=base_url, api_key=api_key, max_retries=retries_covering(RETRY_BUDGET_S)) as client:
        result: dict[str, Any] = client.post(path, body=body, cast_to=dict)
        return result

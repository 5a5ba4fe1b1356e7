"""Durable sessions of the capture proxy: ownership and call counts survive cache eviction and a SIGKILLed
proxy, ends and rewards are idempotent and exactly-once under real concurrency, a retried call is
answered with what it got, and an agent on the SDK rides out a proxy restart.

Real broker (`bus_config`), the native engine under uvicorn (`engine_a`), proxies in this process
(`start_proxy`) or as `python -m agents_adapter.proxy` subprocesses (`ServiceProcess`) that can be SIGKILLed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agents_adapter.proxy.recording import session_started
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.session_store import SessionStore
from agents_adapter.sdk import IDEMPOTENCY_HEADER, AgentSession, AsyncAgentSession, retries_covering
from bus.config import BusConfig
from bus.producer import EventProducer
from schemas import events as ev
from schemas.events import LLMCall, SessionEnded
from tests.adapter.support import free_port, wait_for
from tests.adapter.test_adapter_service import Proxy, echo, recorded, start_proxy
from tests.factories import example
from tests.service_process import ServiceProcess

__all__ = ["start_proxy"]  # the fixture, used here by name
HI: Any = [{"role": "user", "content": "hi"}]


def _ended(bus: BusConfig, session_id: str) -> list[SessionEnded]:
    return [e for e in recorded(bus, "sessions", SessionEnded) if e.session_id == session_id]


def _calls(bus: BusConfig, session_id: str) -> list[LLMCall]:
    return sorted((c for c in recorded(bus, "llm.calls", LLMCall) if c.session_id == session_id),
                  key=lambda c: c.turn)


# ------------------------------------------------------------------------------------------ the store


@pytest.mark.unit
def test_store_keeps_sessions_calls_and_closes_across_reopening(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    store = SessionStore(path)
    state = SessionState("s1", "agent-a", "t1", "g1", {"k": "v"}, calls_served=2, next_turn=2)
    started = session_started(state, "adapter-0")
    call = example(LLMCall, 1, session_id="s1")
    store.begin_calls(state, "key-1", [started, call], [None, {"kind": "tokens"}])
    store.save_close(state, "end", {"reward": None, "status": "completed"}, {"phase": "awaiting_reward"})
    store.close()

    again = SessionStore(path)  # as after a restart
    loaded = again.load("s1")
    assert loaded is not None
    assert (loaded.agent_id, loaded.task_id, loaded.group_id, loaded.metadata, loaded.calls_served,
            loaded.next_turn, loaded.phase) == ("agent-a", "t1", "g1", {"k": "v"}, 2, 2, "open")
    assert [type(e) for e in again.unacked()[("s1", "key-1")]] == [ev.SessionStarted, LLMCall]
    assert [c.event for c in again.calls("s1", "key-1")] == [started, call]
    assert [c.tito for c in again.recent_calls("s1", 16)] == [{"kind": "tokens"}]
    again.acked(loaded, "key-1", keep=1)
    assert again.unacked() == {}
    assert [c.event for c in again.calls("s1", "key-1")] == [call]  # only the last `keep` are kept
    record = again.close_record("s1", "end")
    assert record is not None and record.answer == {"phase": "awaiting_reward"}
    loaded.phase = "ended"
    again.save_close(loaded, "reward", {"reward": 1.0, "status": None}, {"phase": "ended"})
    assert again.calls("s1", "key-1") == []  # an ended session's calls are not kept
    assert again.prune(3600) == 0 and again.prune(-1) == 1 and again.load("s1") is None


@pytest.mark.unit
def test_sdk_retries_cover_a_restart_with_an_idempotency_key() -> None:
    assert retries_covering(0) == 0
    shortest = sum(0.75 * min(0.5 * 2**i, 8.0) for i in range(retries_covering(60)))
    assert shortest >= 60 > shortest - 6  # just enough retries
    session = AgentSession("http://127.0.0.1:1/v1", "k", retry_budget_s=60)
    try:
        assert session.client.max_retries == retries_covering(60) == session.end_max_retries
        copy = session.client.with_options(max_retries=0)  # the key goes on every try, copies included
        assert session.client._idempotency_header == IDEMPOTENCY_HEADER == copy._idempotency_header
    finally:
        session.close()


# -------------------------------------------------------------------------------- in-process proxy


@pytest.mark.kafka
def test_an_evicted_session_keeps_its_owner_counts_and_token_cache(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), session_cache_size=1)
    mine, other = proxy.client(session="kept"), proxy.client(key="key-b", session="pusher")
    messages: list[Any] = list(HI)
    first = mine.chat.completions.create(model=proxy.model, messages=messages, max_tokens=3)
    other.chat.completions.create(model=proxy.model, messages=HI, max_tokens=2)  # evicts "kept" from the cache
    assert proxy.service.book.sessions.get("kept") is None
    messages += [echo(first.choices[0].message), {"role": "user", "content": "more"}]
    second = mine.chat.completions.create(model=proxy.model, messages=messages, max_tokens=3)
    assert second.model_extra is not None and first.model_extra is not None
    assert second.model_extra["sflow"]["turns"] == [1] and second.model_extra["sflow"]["drift"] is False
    assert second.model_extra["sflow"]["parent_call_id"] == first.model_extra["sflow"]["call_ids"][0]
    other.chat.completions.create(model=proxy.model, messages=HI, max_tokens=2)  # evicts it again
    with pytest.raises(openai.PermissionDeniedError):
        proxy.client(key="key-b", session="kept").chat.completions.create(model=proxy.model, messages=HI,
                                                                           max_tokens=2)
    assert proxy.post("/v1/sessions/kept/end", {"reward": 1.0}, key="key-b").status_code == 403
    assert proxy.post("/v1/sessions/kept/end", {"reward": 1.0}).json()["num_calls"] == 2
    (ended,) = _ended(bus_config, "kept")
    assert ended.num_calls == 2 == len(_calls(bus_config, "kept"))
    assert proxy.service.book.sessions_restored >= 2


@pytest.mark.kafka
def test_end_is_idempotent_and_concurrent_closes_publish_one_session_ended(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    for sid in ("rewards", "end-vs-reward", "awaiting"):
        proxy.client(session=sid).chat.completions.create(model=proxy.model, messages=HI, max_tokens=2)
    auth = {"Authorization": "Bearer key-a"}

    async def race(requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, headers=auth, timeout=60) as client:
            return list(await asyncio.gather(*(client.post(path, json=body) for path, body in requests)))

    answers = asyncio.run(race([("/v1/sessions/rewards/reward", {"reward": r}) for r in (0.1, 0.2, 0.3, 0.2, 0.1)]))
    won = [a for a in answers if a.status_code == 200]
    (ended,) = _ended(bus_config, "rewards")
    assert won and {a.json()["reward"] for a in won} == {ended.reward}  # repeats of the winner get its answer
    assert all(a.status_code == 409 and a.headers["x-should-retry"] == "false" for a in answers if a not in won)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:  # threads this time: /end racing /reward
        futures = [pool.submit(proxy.post, "/v1/sessions/end-vs-reward/end", {"reward": 1.0}) for _ in range(3)]
        futures += [pool.submit(proxy.post, "/v1/sessions/end-vs-reward/reward", {"reward": 0.5}) for _ in range(3)]
        codes = sorted(f.result().status_code for f in futures)
    (ended,) = _ended(bus_config, "end-vs-reward")
    assert codes.count(200) == 3 and codes.count(409) == 3  # the winner's kind answered thrice, the other refused

    first = proxy.post("/v1/sessions/awaiting/end", {"status": "completed"})
    again = proxy.post("/v1/sessions/awaiting/end", {"status": "completed"})  # a client retry
    assert first.status_code == again.status_code == 202 and first.json() == again.json()
    assert proxy.post("/v1/sessions/awaiting/end", {"reward": 1.0}).status_code == 409  # a different end
    assert _ended(bus_config, "awaiting") == []
    paid = proxy.post("/v1/sessions/awaiting/reward", {"reward": 0.75})
    assert paid.status_code == 200
    assert proxy.post("/v1/sessions/awaiting/reward", {"reward": 0.75}).json() == paid.json()
    assert proxy.post("/v1/sessions/awaiting/end", {"status": "completed"}).json() == first.json()
    (ended,) = _ended(bus_config, "awaiting")
    assert (ended.reward, ended.num_calls) == (0.75, 1)


@pytest.mark.kafka
def test_a_retried_call_gets_its_recorded_answer_not_a_second_call(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    body = {"model": proxy.model, "messages": HI, "max_tokens": 4, "temperature": 1.0}
    headers = {"X-Session-Id": "retried", IDEMPOTENCY_HEADER: "call-1"}
    first = proxy.post("/v1/chat/completions", body, **headers).json()
    again = proxy.post("/v1/chat/completions", body, **headers).json()  # the answer was lost: the client retries
    assert again["sflow"]["call_ids"] == first["sflow"]["call_ids"]
    assert again["choices"][0]["message"] == first["choices"][0]["message"]

    async def duplicates() -> list[httpx.Response]:  # a retry while the first try is still being served
        async with httpx.AsyncClient(base_url=proxy.url, headers={"Authorization": "Bearer key-a"},
                                     timeout=60) as client:
            return list(await asyncio.gather(*(
                client.post("/v1/chat/completions", json=body | {"n": 2},
                            headers={"X-Session-Id": "retried", IDEMPOTENCY_HEADER: "call-2"})
                for _ in range(4))))

    answers = [r.json() for r in asyncio.run(duplicates())]
    assert len({tuple(a["sflow"]["call_ids"]) for a in answers}) == 1 and len(answers[0]["sflow"]["call_ids"]) == 2
    calls = _calls(bus_config, "retried")
    assert [c.turn for c in calls] == [0, 1, 2] and len({c.call_id for c in calls}) == 3
    assert proxy.service.requests_replayed == 4
    assert proxy.post("/v1/sessions/retried/end", {"reward": 1.0}).json()["num_calls"] == 3


# ------------------------------------------------------------------------------ a SIGKILLed proxy


class ProxyProcess(ServiceProcess):
    """`python -m agents_adapter.proxy` on a fixed port and store, so a restart is the same proxy."""

    def __init__(self, bus: BusConfig, log: Path, model_dir: Path, engine_url: str, store: Path) -> None:
        self.port = free_port()
        super().__init__("agents_adapter.proxy", bus, log, {
            "model-path": model_dir, "port": self.port, "endpoint": f"rollout-a={engine_url}",
            "session-store-path": store, "log-level": "info"},
            env={"SFLOW_ADAPTER_API_KEYS": "agent-a=key-a,agent-b=key-b", "OMP_NUM_THREADS": "1"})
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 90.0) -> ProxyProcess:
        self.wait_healthy(f"{self.url}/health", timeout_s)
        return self


@pytest.fixture
def proxy_process(bus_config: BusConfig, tmp_path: Path, tiny_model_dir: Path,
                  engine_a: tuple[str, Any]) -> Iterator[ProxyProcess]:
    proc = ProxyProcess(bus_config, tmp_path / "proxy.log", tiny_model_dir, engine_a[0], tmp_path / "sessions.sqlite")
    proc.start()
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def _running(engine: Any) -> bool:
    return any(len(r.output_ids) >= 2 for r in engine.snapshot())


@pytest.mark.kafka
@pytest.mark.slow
def test_an_sdk_session_rides_out_a_sigkilled_proxy(
    bus_config: BusConfig, proxy_process: ProxyProcess, engine_a: tuple[str, Any],
) -> None:
    """Killed while a call is being generated, restarted on the same port and store: the SDK retries
    that call, the session goes on with its counts, owner and token cache, and ends with every call."""
    proxy, engine = proxy_process, engine_a[1]
    killed = threading.Event()
    with AgentSession(f"{proxy.url}/v1", "key-a", session_id="survivor", group_id="g-1",
                      retry_budget_s=60) as session:
        model = session.client.models.list().data[0].id
        messages: list[Any] = list(HI)
        replies = []
        for turn in range(4):
            if turn == 2:  # this call is in generation when the proxy dies
                def kill_then_restart() -> None:
                    wait_for(lambda: _running(engine), 60, 0.005)
                    proxy.kill()
                    killed.set()
                    proxy.start()

                threading.Thread(target=kill_then_restart, daemon=True).start()
            reply = session.client.chat.completions.create(model=model, messages=messages, max_tokens=60,
                                                           extra_body={"ignore_eos": True})
            replies.append(reply)
            messages += [echo(reply.choices[0].message), {"role": "user", "content": f"turn {turn}"}]
        session.reward = 1.0
    assert killed.is_set() and proxy.starts == 2 and session.ended is not None
    assert session.ended["num_calls"] == 4
    calls = _calls(bus_config, "survivor")
    assert [c.turn for c in calls] == [0, 1, 2, 3] and len({c.call_id for c in calls}) == 4
    assert not any(c.drift for c in calls)  # the token cache came back from the store
    assert [c.parent_call_id for c in calls[1:]] == [c.call_id for c in calls[:-1]]
    (ended,) = _ended(bus_config, "survivor")
    assert (ended.num_calls, ended.reward, ended.status, ended.group_id) == (4, 1.0, ev.SessionStatus.COMPLETED,
                                                                              "g-1")
    # after the restart the owner is still enforced, and the end is still idempotent
    chat = {"model": model, "messages": HI, "max_tokens": 2}
    intruder = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat, timeout=60,
                          headers={"Authorization": "Bearer key-b", "X-Session-Id": "survivor"})
    assert intruder.status_code == 403
    repeat = httpx.post(f"{proxy.url}/v1/sessions/survivor/end", json={"reward": 1.0, "status": "completed"},
                        headers={"Authorization": "Bearer key-a"}, timeout=60)
    assert repeat.status_code == 200 and repeat.json() == session.ended and len(_ended(bus_config, "survivor")) == 1


@pytest.mark.kafka
@pytest.mark.slow
def test_a_restarted_proxy_knows_counts_and_owners_and_publishes_only_what_a_crash_left_off_the_log(
    bus_config: BusConfig, proxy_process: ProxyProcess, tmp_path: Path, tiny_model_dir: Path,
) -> None:
    proxy = proxy_process
    chat = {"model": tiny_model_dir.name, "messages": HI, "max_tokens": 2}
    auth_a = {"Authorization": "Bearer key-a"}
    for _ in range(3):
        answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat, timeout=60,
                            headers=auth_a | {"X-Session-Id": "counted"})
        assert answer.status_code == 200, answer.text
    proxy.kill()
    store = SessionStore(tmp_path / "sessions.sqlite")
    state = store.load("counted")
    assert state is not None and state.calls_served == 3
    # a crash between Kafka's acknowledgement and the store's note of it leaves a call on the log, not noted
    stored = example(LLMCall, 8, session_id="counted", agent_id="agent-a", turn=3, call_id="stored-call")
    state.calls_served, state.next_turn = 4, 4
    store.begin_calls(state, "key-stored", [stored], [None])
    producer = EventProducer(bus_config)
    producer.publish_sync(stored)
    producer.close()
    # one between the store write and Kafka's acknowledgement: a call counted, not in the log (recovered
    # after the first: once it is on the log, the first was dealt with)
    lost = example(LLMCall, 7, session_id="counted", agent_id="agent-a", turn=4, call_id="lost-call")
    state.calls_served, state.next_turn = 5, 5
    store.begin_calls(state, "key-lost", [lost], [None])
    store.close()
    proxy.start()
    proxy.wait_ready()

    wait_for(lambda: any(c.call_id == "lost-call" for c in _calls(bus_config, "counted")), 30, 0.2)
    intruder = httpx.post(f"{proxy.url}/v1/sessions/counted/end", json={"reward": 1.0}, timeout=60,
                          headers={"Authorization": "Bearer key-b"})
    assert intruder.status_code == 403
    ended = httpx.post(f"{proxy.url}/v1/sessions/counted/end", json={"reward": 1.0}, headers=auth_a, timeout=60)
    assert ended.status_code == 200 and ended.json()["num_calls"] == 5
    (event,) = _ended(bus_config, "counted")
    calls = [c.call_id for c in _calls(bus_config, "counted")]
    assert event.num_calls == 5 == len(calls) == len(set(calls)) and calls.count("stored-call") == 1


@pytest.mark.kafka
def test_the_async_sdk_retries_a_call_while_the_proxy_is_down(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], tiny_model_dir: Path,
) -> None:
    """The proxy comes up only after the agent's first call was sent: the call is retried, not failed."""
    port = free_port()
    later = threading.Timer(2.0, lambda: start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), port=port))

    async def episode() -> dict[str, Any] | None:
        async with AsyncAgentSession(f"http://127.0.0.1:{port}/v1", "key-a", session_id="late-proxy",
                                     retry_budget_s=30) as session:
            later.start()
            await session.client.chat.completions.create(model=tiny_model_dir.name, messages=HI, max_tokens=2)
            session.reward = 0.5
        return session.ended

    ended = asyncio.run(episode())
    later.join()
    assert ended is not None and ended["num_calls"] == 1
    (event,) = _ended(bus_config, "late-proxy")
    assert (event.num_calls, event.reward) == (1, 0.5)

"""The capture proxy end to end: a real broker, the native engine under uvicorn, the official openai client.

Each test starts its own proxy (fresh topic prefix from `bus_config`); the in-process engine is shared
by the module, a second engine runs as a subprocess where a test needs one. Generations are short.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agents_adapter.proxy.app import create_app
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.config import AdapterConfig
from agents_adapter.sdk import AgentSession, AsyncAgentSession, report_reward_later
from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.consumer import EventConsumer, unique_group
from bus.producer import EventProducer
from bus.replay import replay
from examples.calculator.agent import CalculatorAgent, arun_episode, run_episode
from examples.calculator.tasks import make_arithmetic_tasks
from examples.context_rewriting.agent import CompactingAgent, ContextCompactor
from infra.kafka.cluster import KafkaCluster, free_base_port
from schemas import events as ev
from schemas.prompt_refs import PromptResolver
from tests.adapter.conftest import ADMIN_KEY
from tests.adapter.support import EngineProcess, engine_inputs, free_port, serve, wait_for

pytestmark = pytest.mark.kafka
CALCULATOR: Any = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}


@dataclasses.dataclass
class Proxy:
    url: str
    app: Any
    config: AdapterConfig

    @property
    def service(self) -> Any:
        return self.app.state.service

    @property
    def model(self) -> str:
        return self.config.model_name

    def client(self, key: str = "key-a", session: str | None = None, **headers: str) -> openai.OpenAI:
        extra = ({"X-Session-Id": session} if session else {}) | headers
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, default_headers=extra, max_retries=0,
                             timeout=120)

    def post(self, path: str, body: Any, key: str | None = "key-a", **headers: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.url}{path}", content=content, headers=auth | headers, timeout=120)


@pytest.fixture
def start_proxy(tiny_model_dir: Path, codec: ChatCodec) -> Iterator[Callable[..., Proxy]]:
    stack = ExitStack()

    def start(bus: BusConfig, endpoints: tuple[str, ...] = (), **overrides: Any) -> Proxy:
        values: dict[str, Any] = {"routing_from_events": False, "delivery_timeout_ms": 5000} | overrides
        port = values.pop("port", None) or free_port()
        config = AdapterConfig.build(
            env={"SFLOW_ADAPTER_API_KEYS": "agent-a=key-a,agent-b=key-b", "SFLOW_ADAPTER_ADMIN_KEY": ADMIN_KEY},
            model_path=tiny_model_dir, port=port, inference_endpoints=list(endpoints), bus=bus, **values,
        )
        app = create_app(config, codec=codec)
        url = stack.enter_context(serve(app, config.port))
        return Proxy(url, app, config)

    yield start
    stack.close()
    gc.collect()  # frees the proxies' librdkafka handles now, not when the broker is long gone


def recorded(bus: BusConfig, topic: str, kind: type[ev.Event]) -> list[Any]:
    return [r.event for r in replay(bus, [topic]).events if isinstance(r.event, kind)]


def raw_calls(bus: BusConfig, session_id: str, n: int) -> list[ev.LLMCall]:
    """The session's calls as `llm.calls` holds them (bus.replay resolves references; this reads them as recorded)."""
    consumer = EventConsumer(bus, unique_group("raw"), ["llm.calls"])
    got: list[ev.LLMCall] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += [r.event for r in consumer.poll(0.5)
                    if isinstance(r.event, ev.LLMCall) and r.event.session_id == session_id]
    finally:
        consumer.close()
    return sorted(got, key=lambda c: c.turn)


def echo(message: Any) -> dict[str, Any]:
    """The reply as agents send it back (the openai message object, dumped)."""
    return dict(message.model_dump(exclude_none=True))


# ------------------------------------------------------------------------------- token-in/token-out


def test_ten_turn_session_records_exactly_what_the_engine_saw(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], codec: ChatCodec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, engine = engine_a
    seen = engine_inputs(engine, monkeypatch)
    proxy = start_proxy(bus_config, (f"rollout-a={url}",))
    messages: list[Any] = [{"role": "system", "content": "You add numbers."},
                                      {"role": "user", "content": "1+1?"}]
    with AgentSession(f"{proxy.url}/v1", "key-a", task_id="task-7", group_id="group-7", max_retries=0) as session:
        for turn in range(10):
            reply = session.client.chat.completions.create(model=proxy.model, messages=messages, tools=[CALCULATOR],
                                                           max_tokens=6, temperature=1.0)
            assert reply.model_extra is not None and reply.model_extra["sflow"]["turns"] == [turn]
            messages += [echo(reply.choices[0].message), {"role": "user", "content": f"and {turn}+1?"}]
        session.reward = 1.0

    calls = sorted((c for c in recorded(bus_config, "llm.calls", ev.LLMCall) if c.session_id == session.session_id),
                   key=lambda c: c.turn)
    assert [c.turn for c in calls] == list(range(10))
    for k, call in enumerate(calls):
        engine_input, future = seen[f"{call.call_id}-0"]
        assert list(call.prompt_ids) == engine_input  # exactly the tokens the engine read...
        assert list(call.output_ids) == future.result().output_ids  # ...and wrote
        assert list(call.output_logprobs) == pytest.approx(future.result().output_logprobs, abs=1e-6)
        assert not call.drift and (call.task_id, call.group_id, call.agent_id) == ("task-7", "group-7", "agent-a")
        assert len(call.segments) == 1 and call.segments[0].resource_id == "rollout-a"
        if k:
            previous = calls[k - 1]
            history = list(previous.prompt_ids) + list(previous.output_ids)
            assert call.parent_call_id == previous.call_id
            assert list(call.prompt_ids[: len(history)]) == history
            suffix = codec.glue(list(previous.output_ids)) + codec.render_tail([messages[2 * k + 1]])
            assert list(call.prompt_ids[len(history):]) == codec.encode(suffix)
    trajectory = list(calls[-1].prompt_ids) + list(calls[-1].output_ids)
    for call in calls:  # every call is a prefix of the final token sequence: one path, zero drift
        whole = list(call.prompt_ids) + list(call.output_ids)
        assert trajectory[: len(whole)] == whole
    (started,) = [e for e in recorded(bus_config, "sessions", ev.SessionStarted) if e.session_id == session.session_id]
    (ended,) = [e for e in recorded(bus_config, "sessions", ev.SessionEnded) if e.session_id == session.session_id]
    assert (started.task_id, started.group_id) == ("task-7", "group-7")
    assert (ended.reward, ended.status, ended.num_calls) == (1.0, ev.SessionStatus.COMPLETED, 10)
    assert proxy.service.drift_by_agent["agent-a"] == 0


def test_a_compacting_agent_s_forks_are_recorded_from_the_fork_point(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """examples/context_rewriting's agent through the proxy: extensions go on `llm.calls` by reference to their
    parent, each rewrite (a fork) by reference to a recorded call up to the fork point, and the raw log resolved
    (schemas.prompt_refs) is exactly what the engine read."""
    url, engine = engine_a
    seen = engine_inputs(engine, monkeypatch)
    proxy = start_proxy(bus_config, (f"rollout-a={url}",))
    agent = CompactingAgent(proxy.model, ContextCompactor(every=3, keep_turns=1), max_turns=8, max_tokens=4)
    with AgentSession(f"{proxy.url}/v1", "key-a", max_retries=0) as session:
        agent.run(session.client, "You explore. " * 20, "List the files.", lambda reply: f"listing of {reply!r}")
        session.reward = 1.0
    assert agent.rewrites == 2
    mine = raw_calls(bus_config, session.session_id, 8)
    assert [c.by_reference for c in mine] == [False] + [True] * 7
    forks = [c for c in mine if c.drift]
    assert [c.turn for c in forks] == [3, 6]
    for fork in forks:  # from the fork point: the shared system prompt, not the whole parent
        base = next(c for c in mine if c.call_id == fork.prompt_base_call_id)
        assert 0 < fork.prompt_base_len < base.prompt_len + len(base.output_ids)
    resolver = PromptResolver()
    for call in mine:
        assert list(resolver.resolve(call).prompt_ids) == seen[f"{call.call_id}-0"][0]


def test_edited_history_is_flagged_and_counted(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    client = proxy.client(session="edited")
    messages: list[Any] = [{"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model=proxy.model, messages=messages, max_tokens=4)
    messages += [{"role": "assistant", "content": "a nicer answer"}, {"role": "user", "content": "next"}]
    second = client.chat.completions.create(model=proxy.model, messages=messages, max_tokens=4)
    assert second.model_extra is not None and second.model_extra["sflow"]["drift"] is True
    calls = {c.call_id: c for c in recorded(bus_config, "llm.calls", ev.LLMCall)}
    drifted = calls[second.model_extra["sflow"]["call_ids"][0]]
    assert drifted.drift and drifted.parent_call_id == ""
    assert not calls[first.model_extra["sflow"]["call_ids"][0]].drift  # type: ignore[index]
    stats = httpx.get(f"{proxy.url}/admin/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert stats["drift_by_agent"] == {"agent-a": 1} and stats["calls_served"] == 2
    assert stats["drift_classes_by_agent"] == {"agent-a": {"continuation": 0, "realigned": 0, "fork": 1}}


def test_openai_surface_streaming_n_logprobs_completions_and_tokens(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], codec: ChatCodec,
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    client = proxy.client(session="surface")
    assert [m.id for m in client.models.list()] == [proxy.model]
    stream = client.chat.completions.create(
        model=proxy.model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, n=2, stream=True,
        logprobs=True, top_logprobs=1, stream_options={"include_usage": True}, seed=3)
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for delta in chunk.choices:
            texts[delta.index] += delta.delta.content or ""
            if delta.finish_reason:
                finishes[delta.index] = delta.finish_reason
    assert set(finishes) == {0, 1} and usage is not None and usage.completion_tokens <= 10
    plain = client.chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "hi"}],
                                           max_completion_tokens=5, logprobs=True, stop=["\n"])
    choice = plain.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None and plain.usage is not None
    assert len(choice.logprobs.content) <= plain.usage.completion_tokens
    assert all(t.logprob <= 0 and t.top_logprobs == [] for t in choice.logprobs.content)
    assert "\n" not in (choice.message.content or "")

    text = client.completions.create(model=proxy.model, prompt="Q: 2+2\nA:", max_tokens=4, logprobs=1)
    follow = client.completions.create(model=proxy.model, prompt="Q: 2+2\nA:" + text.choices[0].text + "\nQ:",
                                       max_tokens=3)
    assert follow.model_extra is not None and text.model_extra is not None
    assert follow.model_extra["sflow"]["parent_call_id"] == text.model_extra["sflow"]["call_ids"][0]

    prompt_ids = codec.encode(codec.render([{"role": "user", "content": "tokens"}]))
    first = proxy.post("/v1/generate", {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 4}},
                       **{"X-Session-Id": "tok"}).json()
    more = prompt_ids + first["output_ids"] + codec.encode("\n<|im_start|>user\nmore<|im_end|>\n")
    second = proxy.post("/v1/generate", {"input_ids": more, "sampling_params": {"max_new_tokens": 4,
                                                                                  "temperature": 0}},
                        **{"X-Session-Id": "tok"}).json()
    assert second["meta_info"]["parent_call_id"] == first["meta_info"]["id"]
    assert len(second["meta_info"]["output_token_logprobs"]) == len(second["output_ids"]) <= 4
    assert second["meta_info"]["segments"][0]["resource_id"] == "rollout-a"
    ids = {c.call_id for c in recorded(bus_config, "llm.calls", ev.LLMCall)}
    assert len(ids) == 2 + 1 + 2 + 2 and first["meta_info"]["id"] in ids


# ---------------------------------------------------------------------------- partial rollout


def _call_in_background(pool: concurrent.futures.ThreadPoolExecutor, client: openai.OpenAI, model: str,
                        max_tokens: int) -> concurrent.futures.Future[Any]:
    return pool.submit(lambda: client.chat.completions.create(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": "count"}],
        extra_body={"ignore_eos": True}))


def _running_tokens(engine: Any) -> int:
    return max((len(r.output_ids) for r in engine.snapshot()), default=0)


def test_a_call_spanning_a_weight_swap_returns_normally_with_both_versions(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], tiny_model_dir: Path,
    perturbed_model_dir: Path,
) -> None:
    url, engine = engine_a
    proxy = start_proxy(bus_config, (f"rollout-a={url}",))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = _call_in_background(pool, proxy.client(session="swap"), proxy.model, 300)
        wait_for(lambda: _running_tokens(engine) >= 3)
        try:
            assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).status_code == 200
            swap = httpx.post(f"{url}/update_weights_from_disk", timeout=60,
                              json={"model_path": str(perturbed_model_dir), "weight_version": "1"})
            assert swap.status_code == 200 and swap.json()["num_paused_requests"] == 1
        finally:
            httpx.post(f"{url}/continue_generation", json={})
        reply = pending.result(120)
    try:
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 300
        (call,) = recorded(bus_config, "llm.calls", ev.LLMCall)
        versions = list(call.output_versions)
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        assert len(call.segments) == 1 and call.segments[0].num_tokens == 300
    finally:
        httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "weight_version": "0"},
                   timeout=60)


def _publish(bus: BusConfig, *events: ev.Event) -> None:
    with EventProducer(bus) as producer:
        for event in events:
            producer.publish_sync(event, timeout_s=30)


def _rollout_resource(rid: str, url: str) -> list[ev.Event]:
    return [
        ev.ResourceRegistered(resource_id=rid, endpoint=url, device_kind="cpu", memory_bytes=1, hbm_bandwidth=1.0,
                              peak_flops=1.0, capabilities=("rollout",)),
        ev.TagTransition(resource_id=rid, tag_kind=ev.TagKind.ACTIVITY, from_tags=("idle",), to_tags=("rollout",),
                         cause="test"),
    ]


def test_preempted_call_resumes_on_another_engine_process_and_survives_its_death(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], perturbed_model_dir: Path,
    engine_process: Callable[..., EngineProcess],
) -> None:
    url, engine = engine_a
    other = engine_process(perturbed_model_dir, "rollout-b", weight_version=1)
    proxy = start_proxy(bus_config, routing_from_events=True, long_request_timeout_s=120)
    other.wait_ready()
    _publish(bus_config, *_rollout_resource("rollout-a", url), *_rollout_resource("rollout-b", other.url))
    wait_for(lambda: proxy.app.state.routing.usable_ids() == ["rollout-a", "rollout-b"], 30)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        client = proxy.client(session="preempted")
        pending = _call_in_background(pool, client, proxy.model, 400)
        wait_for(lambda: _running_tokens(engine) >= 5)
        try:  # what the inference controller does on PauseRollout(abort), then the event the proxy also reads
            assert httpx.post(f"{url}/pause_generation", json={"mode": "abort"}).json()["num_requests"] == 1
            _publish(bus_config, ev.PauseRollout(resource_id="rollout-a", mode=ev.PauseMode.ABORT, reason="train"))
            reply = pending.result(120)
        finally:
            httpx.post(f"{url}/continue_generation", json={})
            _publish(bus_config, ev.ResumeRollout(resource_id="rollout-a", reason="train step done"))
        assert reply.choices[0].finish_reason == "length" and reply.usage is not None
        assert reply.usage.completion_tokens == 400
        (call,) = recorded(bus_config, "llm.calls", ev.LLMCall)
        first, second = call.segments
        assert (first.resource_id, first.finish_reason, second.resource_id, second.finish_reason) == (
            "rollout-a", "abort", "rollout-b", "length")
        assert first.num_tokens >= 5 and first.num_tokens + second.num_tokens == 400 == len(call.output_ids)
        assert list(call.output_versions) == [0] * first.num_tokens + [1] * second.num_tokens

        wait_for(lambda: proxy.app.state.routing.usable_ids() == ["rollout-a", "rollout-b"], 30)
        pending = _call_in_background(pool, client, proxy.model, 700)  # sticky: goes to rollout-b
        wait_for(lambda: httpx.get(f"{other.url}/engine_stats").json()["running"] == 1, 30, 0.01)
        other.kill()
        reply = pending.result(120)
    assert reply.choices[0].finish_reason == "length" and reply.usage is not None
    assert reply.usage.completion_tokens == 700
    died = next(c for c in recorded(bus_config, "llm.calls", ev.LLMCall) if c.call_id != call.call_id)
    assert [(s.resource_id, s.finish_reason, s.num_tokens) for s in died.segments] == [
        ("rollout-b", "error", 0), ("rollout-a", "length", 700)]
    assert proxy.service.dispatcher.resumed_calls == 2


def test_while_every_resource_is_paused_the_call_waits_then_fails_cleanly(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, routing_from_events=True, long_request_timeout_s=4.0)
    pause = ev.PauseRollout(resource_id="rollout-a", mode=ev.PauseMode.IN_PLACE, reason="weight_sync")
    _publish(bus_config, *_rollout_resource("rollout-a", engine_a[0]), pause)
    wait_for(lambda: proxy.app.state.routing.events_applied == 3, 30)
    client = proxy.client(session="paused")
    ask: dict[str, Any] = {"model": proxy.model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: client.chat.completions.create(**ask))
        time.sleep(0.7)
        assert not pending.done()  # held while the only resource is paused...
        _publish(bus_config, ev.ResumeRollout(resource_id="rollout-a", reason="synced"))
        assert pending.result(60).choices[0].finish_reason in ("stop", "length")  # ...and served after the resume
    _publish(bus_config, pause)
    wait_for(lambda: proxy.app.state.routing.usable_ids() == [], 30)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(**ask)
    assert failure.value.status_code == 503 and 3.9 < time.monotonic() - started < 15
    error = failure.value.response.json()["error"]
    assert error["code"] == "no_rollout_resource" and "paused (in_place)" in error["message"]
    assert len(recorded(bus_config, "llm.calls", ev.LLMCall)) == 1  # the refused call was never recorded


# ------------------------------------------------------------------------------------- recording


def test_kafka_down_means_503_and_every_served_call_is_recorded(
    tmp_path: Path, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    cluster = KafkaCluster(tmp_path / "kafka", nodes=1, base_port=free_base_port())
    cluster.start()
    try:
        bus = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="down.")
        ensure_topics(bus)
        proxy = start_proxy(bus, (f"rollout-a={engine_a[0]}",), delivery_timeout_ms=3000)
        client = proxy.client(session="kafka")
        served: list[str] = []

        def call() -> None:
            reply = client.chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "x"}],
                                                   max_tokens=3)
            served.extend(reply.model_extra["sflow"]["call_ids"])  # type: ignore[index]

        call()
        call()
        cluster.stop()
        with pytest.raises(openai.APIStatusError) as failure:
            call()
        assert failure.value.status_code == 503
        assert failure.value.response.json()["error"]["code"] == "recording_unavailable"
        refused = 1
        cluster.start()
        deadline = time.monotonic() + 90
        while True:  # the producer reconnects on its own; until then calls are refused, never served
            try:
                call()
                break
            except openai.APIStatusError as e:
                assert e.status_code == 503 and time.monotonic() < deadline
                refused += 1
        call()
        ids = [c.call_id for c in recorded(bus, "llm.calls", ev.LLMCall)]
        assert len(served) == 4 and len(ids) == len(set(ids))  # each call recorded at most once
        assert set(served) <= set(ids)  # every served call is in the log
        # a refused call may still have reached the log (its acknowledgement came too late): never more
        assert len(ids) - len(served) <= refused
    finally:
        cluster.stop()


def test_a_call_recorded_while_kafka_is_away_is_served_once_kafka_is_back(
    tmp_path: Path, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    """Kafka goes away while a call is recorded and comes back within `delivery_timeout_ms`: the agent
    gets its answer, and the call is recorded once (with a broker of three, one event of a call could be
    acknowledged while another timed out: a 503 then left a recorded call its agent was told failed)."""
    cluster = KafkaCluster(tmp_path / "kafka", nodes=1, base_port=free_base_port())
    cluster.start()
    try:
        bus = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="retry.")
        ensure_topics(bus)
        proxy = start_proxy(bus, (f"rollout-a={engine_a[0]}",), delivery_timeout_ms=90_000)
        client = proxy.client(session="retry")
        first = client.chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "x"}],
                                               max_tokens=3)
        cluster.stop()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.chat.completions.create, model=proxy.model, max_tokens=3,
                                  messages=[{"role": "user", "content": "y"}])
            wait_for(lambda: proxy.service.recorder.awaiting > 0, timeout_s=60)  # the call waits for Kafka
            cluster.start()
            second = pending.result(timeout=120)
        served = [*first.model_extra["sflow"]["call_ids"], *second.model_extra["sflow"]["call_ids"]]  # type: ignore[index]
        ids = [c.call_id for c in recorded(bus, "llm.calls", ev.LLMCall)]
        assert ids == served  # each served call recorded once, nothing the agent was not served
        assert proxy.service.recorder.failed == 0
    finally:
        cluster.stop()


# ------------------------------------------------------------------------------ sessions and errors


def test_bad_input_is_refused_with_openai_errors_and_the_proxy_keeps_serving(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), max_prompt_tokens=300)
    ok: Any = [{"role": "user", "content": "hi"}]
    mine = proxy.client(session="owned")
    mine.chat.completions.create(model=proxy.model, messages=ok, max_tokens=2)

    def status(action: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
        with pytest.raises(openai.APIStatusError) as failure:
            action()
        body = failure.value.response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        return failure.value.status_code, body["error"]

    def chat(client: openai.OpenAI, **kwargs: Any) -> Callable[[], Any]:
        return lambda: client.chat.completions.create(**({"model": proxy.model, "messages": ok} | kwargs))

    assert status(chat(proxy.client(key="wrong")))[0] == 401
    assert proxy.post("/v1/chat/completions", {"model": proxy.model, "messages": ok}, key=None).status_code == 401
    code, error = status(chat(proxy.client(key="key-b", session="owned")))
    assert code == 403 and error["code"] == "session_forbidden"
    code, error = status(chat(mine, messages=[{"role": "user", "content": "x" * 400}]))
    assert code == 400 and "max_prompt_tokens=300" in error["message"] and error["code"] == "context_length_exceeded"
    code, error = status(chat(mine, temperature=5))
    assert code == 400 and error["param"] == "temperature"
    assert status(chat(mine, n=0))[0] == 400
    assert status(chat(mine, messages=[]))[0] == 400
    assert status(chat(mine, max_tokens=5000))[1]["param"] == "max_tokens"
    assert status(chat(mine, presence_penalty=1.0))[1]["param"] == "presence_penalty"
    code, error = status(chat(mine, model="gpt-4o"))
    assert code == 404 and error["code"] == "model_not_found"
    broken = proxy.post("/v1/chat/completions", b'{"model": "m", "messages": [', **{"X-Session-Id": "owned"})
    assert broken.status_code == 422 and broken.json()["error"]["code"] == "malformed_json"
    assert proxy.post("/v1/nope", {}).status_code == 404
    assert httpx.get(f"{proxy.url}/admin/stats", headers={"Authorization": "Bearer key-a"}).status_code == 401

    mine.chat.completions.create(model=proxy.model, messages=ok, max_tokens=2)  # still serving, same session
    proxy.client(key="key-b", session="other").chat.completions.create(model=proxy.model, messages=ok, max_tokens=2)
    assert proxy.post("/v1/sessions/owned/end", {"reward": 0.5}, key="key-b").status_code == 403
    assert proxy.post("/v1/sessions/owned/end", {"reward": 0.5}).status_code == 200
    code, error = status(chat(mine))
    assert code == 409 and error["code"] == "session_closed"
    assert len(recorded(bus_config, "llm.calls", ev.LLMCall)) == 3


def test_a_failed_session_is_ended_once_the_proxy_is_back(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy],
) -> None:
    """The proxy is down (restarting) when the agent fails and ends its session: the SDK retries the end
    until the proxy answers, so the session is recorded (failed) and its task group can complete."""
    port = free_port()
    later = threading.Timer(1.5, lambda: start_proxy(bus_config, port=port))
    later.start()
    with pytest.raises(openai.APIConnectionError), AgentSession(
        f"http://127.0.0.1:{port}/v1", "key-a", session_id="proxy-down", group_id="g-down", max_retries=0,
        end_max_retries=10,
    ) as session:
        session.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    later.join()
    assert session.ended is not None
    ended = {e.session_id: e for e in recorded(bus_config, "sessions", ev.SessionEnded)}
    assert (ended["proxy-down"].status, ended["proxy-down"].num_calls) == (ev.SessionStatus.FAILED, 0)
    assert ended["proxy-down"].group_id == "g-down"  # so its task group can still complete


def test_session_end_reward_later_failed_sessions_and_drain(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    base = f"{proxy.url}/v1"
    with AgentSession(base, "key-a", session_id="later", max_retries=0) as session:
        session.client.chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "a"}],
                                               max_tokens=2)
    assert session.ended is not None and session.ended["phase"] == "awaiting_reward"
    assert proxy.post("/v1/sessions/later/end", {"reward": 1.0}).status_code == 409
    assert report_reward_later(base, "key-a", "later", 0.75)["reward"] == 0.75
    assert proxy.post("/v1/sessions/later/reward", {"reward": 1.0}).status_code == 409

    with pytest.raises(RuntimeError), AgentSession(base, "key-a", session_id="crashed", max_retries=0) as failing:
        failing.client.chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "b"}],
                                               max_tokens=2)
        raise RuntimeError("the agent crashed")
    ended = {e.session_id: e for e in recorded(bus_config, "sessions", ev.SessionEnded)}
    assert (ended["later"].reward, ended["later"].status, ended["later"].num_calls) == (
        0.75, ev.SessionStatus.COMPLETED, 1)
    assert (ended["crashed"].reward, ended["crashed"].status) == (0.0, ev.SessionStatus.FAILED)

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    proxy.client(session="open").chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "c"}],
                                                         max_tokens=2)
    drained = httpx.post(f"{proxy.url}/admin/drain", json={"timeout_s": 5, "end_sessions": True}, headers=admin)
    assert drained.json() == {"draining": True, "inflight": 0, "sessions_ended": 1}
    with pytest.raises(openai.APIStatusError) as failure:
        proxy.client(session="new").chat.completions.create(model=proxy.model, max_tokens=2,
                                                            messages=[{"role": "user", "content": "d"}])
    assert failure.value.status_code == 503
    httpx.post(f"{proxy.url}/admin/drain", json={"stop_accepting": False}, headers=admin)
    proxy.client(session="new").chat.completions.create(model=proxy.model, messages=[{"role": "user", "content": "d"}],
                                                        max_tokens=2)
    aborted = [e for e in recorded(bus_config, "sessions", ev.SessionEnded) if e.session_id == "open"]
    assert aborted[0].status == ev.SessionStatus.ABORTED


def test_sessions_sharing_one_http_client_stay_apart_and_leave_it_open(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    """An agent fleet's sessions share one HTTP client (agents_adapter.sdk): each is still recorded as
    its own session, and ending one does not close the client under the others."""
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))

    async def fleet() -> tuple[list[str], bool]:
        async with openai.DefaultAsyncHttpxClient() as http:
            async def one(i: int) -> str:
                async with AsyncAgentSession(f"{proxy.url}/v1", "key-a", task_id=f"t-{i}", max_retries=0,
                                             http_client=http) as s:
                    await s.client.chat.completions.create(model=proxy.model, max_tokens=2,
                                                           messages=[{"role": "user", "content": f"q{i}"}])
                    s.reward = i / 4
                return s.session_id

            ids = list(await asyncio.gather(*(one(i) for i in range(4))))
            return ids, http.is_closed

    ids, closed = asyncio.run(fleet())
    assert not closed
    ended = {e.session_id: e for e in recorded(bus_config, "sessions", ev.SessionEnded)}
    calls = recorded(bus_config, "llm.calls", ev.LLMCall)
    for i, sid in enumerate(ids):
        assert (ended[sid].reward, ended[sid].task_id, ended[sid].num_calls) == (i / 4, f"t-{i}", 1)
        assert [c.task_id for c in calls if c.session_id == sid] == [f"t-{i}"]


def test_calculator_agent_episodes_run_through_the_proxy(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    base = f"{proxy.url}/v1"
    agent = CalculatorAgent(proxy.model, max_turns=3, max_tokens=12)
    first, second = make_arithmetic_tasks(2, seed=1)
    results = [run_episode(base, "key-a", first, agent, group_id="g-1"),
               asyncio.run(arun_episode(base, "key-a", second, agent, group_id="g-2"))]
    ended = {e.session_id: e for e in recorded(bus_config, "sessions", ev.SessionEnded)}
    calls = recorded(bus_config, "llm.calls", ev.LLMCall)
    for result, task in zip(results, (first, second), strict=True):
        assert 1 <= result.turns <= 3 and result.reward in (0.0, 1.0)
        end = ended[result.session_id]
        assert (end.reward, end.task_id, end.num_calls) == (result.reward, task.task_id, result.turns)
        mine = sorted((c for c in calls if c.session_id == result.session_id), key=lambda c: c.turn)
        assert len(mine) == result.turns and not any(c.drift for c in mine)
        assert all(b.parent_call_id == a.call_id for a, b in itertools.pairwise(mine))

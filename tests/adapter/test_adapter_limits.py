"""Bad input against the capture proxy: a clear 4xx naming the problem, never a 5xx, engines unharmed.

Unit tests cover the pure parts (body reader, model limits, error mapper, OpenAPI document); the
HTTP ones run a real proxy (real broker, the native engine under uvicorn) as tests/adapter's others do.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agents_adapter.errors import InvalidBodyError, MalformedRequestError, ProxyError
from agents_adapter.proxy.app import error_response
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.dispatch import EngineSampling
from agents_adapter.proxy.http_requests import read_json
from agents_adapter.proxy.openai_models import BodyLimits, ChatCompletionRequest, CompletionRequest, EndSessionRequest
from bus.config import BusConfig
from tests.adapter.support import free_port, serve, wait_for
from tests.adapter.test_adapter_service import Proxy, start_proxy  # noqa: F401  (fixture)
from tests.fakes import FailingEngine

HI: Any = [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------------------------------- unit


def _refs(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("$ref"), str):
                yield item["$ref"]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve (no {part!r})"
        node = node[part]
    return node


@pytest.mark.kafka
def test_openapi_document_is_valid_and_every_ref_resolves(proxy: Proxy) -> None:
    served = httpx.get(f"{proxy.url}/openapi.json", timeout=30)
    assert served.status_code == 200
    document = served.json()
    refs = set(_refs(document))
    assert "#/components/schemas/ToolCall" in refs and "#/components/schemas/SamplingParams" in refs
    for ref in refs:
        _resolve(document, ref)
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert _resolve(document, body["schema"]["$ref"])["properties"]["messages"]
    from openapi_spec_validator import validate

    validate(document)


@pytest.mark.unit
@pytest.mark.parametrize(("raw", "error", "words"), [
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", InvalidBodyError, "max_json_depth=64"),
    (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", InvalidBodyError, "max_json_depth=64"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', InvalidBodyError, "lone surrogate '\\ud800'"),
    (b'{"content": "caf\xe9"}', InvalidBodyError, "not valid UTF-8: byte 0xe9 at offset 16"),
    (b'{"input_ids": [9223372036854775808]}', InvalidBodyError, "input_ids.0: the integer 9223372036854775808"),
    (b'{"input_ids": [-9223372036854775809]}', InvalidBodyError, "outside the 64-bit range"),
    (b'{"temperature": 1e400}', InvalidBodyError, "temperature: the number is too large"),
    (b'{"reward": NaN}', MalformedRequestError, "NaN is not a JSON number"),
    (b'{"reward": -Infinity}', MalformedRequestError, "-Infinity is not a JSON number"),
])
def test_unsafe_bodies_are_refused_naming_the_problem(raw: bytes, error: type[ProxyError], words: str) -> None:
    with pytest.raises(error) as refused:
        read_json(raw, max_depth=64)
    assert 400 <= refused.value.status_code < 500 and words in str(refused.value)


@pytest.mark.unit
def test_safe_bodies_pass_unchanged() -> None:
    body = {"a": [[[1, -(2**63), 2**63 - 1, 1.5, True, None, "caf\u00e9 \U0001f600"]]], "k\u00e9y": {}}
    assert read_json(json.dumps(body, ensure_ascii=False).encode(), max_depth=8) == body


@pytest.mark.unit
def test_messages_batch_and_reward_limits_come_from_the_context() -> None:
    limits = BodyLimits(max_messages=2, max_batch_prompts=3, max_abs_reward=10.0)
    chat = {"model": "m", "messages": HI * 3}
    with pytest.raises(ValidationError, match="3 messages; this proxy accepts at most max_messages=2"):
        ChatCompletionRequest.model_validate(chat, context=limits)
    assert len(ChatCompletionRequest.model_validate(chat).messages) == 3  # default limit: 1024
    with pytest.raises(ValidationError, match=r"4 prompts in one batch; .* max_batch_prompts=3"):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a"] * 4}, context=limits)
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1] * 50}, context=limits).prompts() == [[1] * 50]
    for reward in (11.0, -1e300, math.inf, math.nan):
        with pytest.raises(ValidationError, match=r"within \+-max_abs_reward=10|finite number"):
            EndSessionRequest.model_validate({"reward": reward}, context=limits)
    with pytest.raises(ValidationError, match=r"max_abs_reward=1e\+06"):
        EndSessionRequest.model_validate({"reward": 1e300})
    assert EndSessionRequest.model_validate({"reward": -10.0}, context=limits).reward == -10.0


@pytest.mark.unit
def test_temperatures_below_the_floor_are_greedy() -> None:
    assert EngineSampling(temperature=1e-39).greedy_below(1e-5).temperature == 0.0
    assert EngineSampling(temperature=1e-5).greedy_below(1e-5).temperature == 1e-5
    assert EngineSampling(temperature=0.7).greedy_below(1e-5).temperature == 0.7
    assert EngineSampling(temperature=1e-39).greedy_below(0.0).temperature == 1e-39


@pytest.mark.unit
def test_a_5xx_body_never_echoes_the_exception() -> None:
    response = error_response(RuntimeError("password=hunter2 at /srv/secret.py line 3"))
    error = json.loads(bytes(response.body))["error"]
    assert response.status_code == 500 and error["type"] == "internal_error"
    assert "hunter2" not in error["message"] and "RuntimeError" not in error["message"]
    assert "the proxy's log has the details" in error["message"]


# ------------------------------------------------------------------------------------ over HTTP


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


def _still_serves(proxy: Proxy, session: str = "after") -> None:
    reply = proxy.client(session=session).chat.completions.create(model=proxy.model, messages=HI, max_tokens=2)
    assert reply.choices[0].message.content is not None


@pytest.fixture
def proxy(bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any]) -> Proxy:  # noqa: F811
    return start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), max_body_bytes=300_000, max_messages=3,
                       max_batch_prompts=2, max_abs_reward=100.0, max_inflight_per_agent=1, retry_after_s=3)


@pytest.mark.kafka
def test_a_body_over_max_body_bytes_is_413_naming_the_limit(proxy: Proxy) -> None:
    big = json.dumps({"model": proxy.model, "messages": [{"role": "user", "content": "x" * 400_000}]}).encode()
    refused = proxy.post("/v1/chat/completions", big)
    assert refused.status_code == 413 and "max_body_bytes=300000" in _error(refused)["message"]
    assert str(len(big)) in _error(refused)["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield big[:200_000]
        yield big[200_000:]

    streamed = httpx.post(f"{proxy.url}/v1/chat/completions", content=chunked(),
                          headers={"Authorization": "Bearer key-a"}, timeout=60)
    assert streamed.status_code == 413 and _error(streamed)["code"] == "payload_too_large"
    _still_serves(proxy)


@pytest.mark.kafka
def test_too_many_messages_or_batch_prompts_are_400_naming_the_limit(proxy: Proxy) -> None:
    many = proxy.post("/v1/chat/completions", {"model": proxy.model, "messages": HI * 4})
    assert many.status_code == 400 and "4 messages" in _error(many)["message"]
    assert "max_messages=3" in _error(many)["message"] and _error(many)["param"] == "messages"
    batch = proxy.post("/v1/completions", {"model": proxy.model, "prompt": ["a", "b", "c"], "max_tokens": 1})
    assert batch.status_code == 400 and "max_batch_prompts=2" in _error(batch)["message"]
    two = proxy.post("/v1/completions", {"model": proxy.model, "prompt": ["a", "b"], "max_tokens": 1})
    assert two.status_code == 200 and len(two.json()["choices"]) == 2


@pytest.mark.kafka
def test_an_agent_over_max_inflight_per_agent_gets_429_with_retry_after(proxy: Proxy) -> None:
    inflight = proxy.app.state.inflight_by_agent
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(lambda: proxy.client(session="slow").chat.completions.create(
            model=proxy.model, messages=HI, max_tokens=600, extra_body={"ignore_eos": True}))
        wait_for(lambda: inflight["agent-a"] == 1 or slow.done(), 30)
        refused = proxy.post("/v1/chat/completions", {"model": proxy.model, "messages": HI, "max_tokens": 1},
                             **{"X-Session-Id": "second"})
        other_agent = proxy.post("/v1/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
                                 key="key-b")
        assert not slow.done(), "the slow call must still be in flight"
        assert slow.result(120).usage.completion_tokens == 600  # type: ignore[union-attr]
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    error = _error(refused)
    assert error["code"] == "rate_limit_exceeded" and "max_inflight_per_agent=1" in error["message"]
    assert other_agent.status_code == 200  # the limit is per agent
    _still_serves(proxy)  # and it is given back


@pytest.mark.kafka
@pytest.mark.parametrize("reward", [b"1e300", b"-101", b"1e400", b"NaN", b"Infinity"])
def test_a_reward_that_is_not_finite_or_out_of_bound_is_400(proxy: Proxy, reward: bytes) -> None:
    _still_serves(proxy, "rewarded")
    for path in ("/v1/sessions/rewarded/end", "/v1/sessions/rewarded/reward"):
        refused = proxy.post(path, b'{"reward": ' + reward + b"}")
        assert 400 <= refused.status_code < 500 and _error(refused)["code"] in ("invalid_parameter", "invalid_body",
                                                                                 "malformed_json")
        message = _error(refused)["message"]
        assert "max_abs_reward=100" in message or "not a JSON number" in message or "too large" in message, message
    ended = proxy.post("/v1/sessions/rewarded/end", {"reward": -100.0})
    assert ended.status_code == 200 and ended.json()["reward"] == -100.0


@pytest.mark.kafka
@pytest.mark.parametrize(("path", "raw", "words"), [
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "max_json_depth=64"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\ud800"}]}',
     "lone surrogate"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
     "not valid UTF-8"),
    ("/v1/generate", b'{"input_ids": [9223372036854775808]}', "outside the 64-bit range"),
    ("/v1/completions", b'{"model": "M", "prompt": "x", "seed": 99999999999999999999}', "outside the 64-bit range"),
])
def test_unsafe_bodies_get_400_over_http_and_the_proxy_keeps_serving(proxy: Proxy, path: str, raw: bytes,
                                                                     words: str) -> None:
    refused = proxy.post(path, raw.replace(b'"M"', json.dumps(proxy.model).encode()))
    assert refused.status_code == 400 and words in _error(refused)["message"], refused.text
    assert _error(refused)["code"] == "invalid_body"
    _still_serves(proxy)


@pytest.mark.kafka
def test_an_engine_4xx_is_a_400_never_retried_and_the_engine_stays_in_rotation(
    proxy: Proxy, codec: ChatCodec,
) -> None:
    routing = proxy.app.state.routing
    for token in (codec.vocab_size + 7, 2**62):
        before = routing.snapshot()[0]["dispatched"]
        refused = proxy.post("/v1/generate", {"input_ids": [token], "sampling_params": {"max_new_tokens": 1}})
        assert refused.status_code == 400 and _error(refused)["code"] == "engine_rejected", refused.text
        assert routing.snapshot()[0]["dispatched"] == before + 1  # sent once, not retried
    assert routing.usable_ids() == ["rollout-a"] and proxy.service.dispatcher.engine_failures == 0
    _still_serves(proxy)


@pytest.mark.kafka
def test_an_engine_answering_5xx_is_not_taken_out_of_rotation_and_the_call_is_not_resent_forever(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy],  # noqa: F811
) -> None:
    failing = FailingEngine(500)
    with serve(failing.app, port := free_port()):
        proxy = start_proxy(bus_config, (f"rollout-x=http://127.0.0.1:{port}",), max_engine_errors_per_call=2,
                            unreachable_cooldown_s=600, avoid_grace_s=0.05, long_request_timeout_s=60)
        refused = proxy.post("/v1/chat/completions", {"model": proxy.model, "messages": HI, "max_tokens": 2})
        assert refused.status_code == 503 and _error(refused)["code"] == "engine_failed"
        assert "max_engine_errors_per_call=2" in _error(refused)["message"]
        assert "fake" not in _error(refused)["message"]  # the engine's own message stays in the log
        assert failing.generate_requests == 2
        assert proxy.app.state.routing.usable_ids() == ["rollout-x"]  # no 600 s cooldown for everyone


@pytest.mark.kafka
def test_a_temperature_below_the_floor_is_served_greedy(proxy: Proxy) -> None:
    client = proxy.client(session="cold")
    reply = client.chat.completions.create(model=proxy.model, messages=HI, max_tokens=4, temperature=1e-39,
                                           logprobs=True)
    logprobs = [t.logprob for t in reply.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert logprobs and all(lp == 0.0 for lp in logprobs)  # greedy: a point mass
    assert proxy.service.dispatcher.engine_failures == 0


@pytest.mark.kafka
def test_a_huge_prompt_is_tokenized_off_the_event_loop(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",), max_body_bytes=8 * 2**20)
    huge = {"model": proxy.model, "messages": [{"role": "user", "content": "hello world, " * 300_000}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        big = pool.submit(proxy.post, "/v1/chat/completions", huge, "key-b")
        wait_for(lambda: proxy.app.state.inflight_by_agent["agent-b"] == 1 or big.done(), 30)
        _still_serves(proxy, "small")  # served while the 3.9 MB prompt is still being tokenized
        assert not big.done(), "the huge prompt finished first: was the small call held up by it?"
        refused = big.result(120)
    assert refused.status_code == 400 and _error(refused)["code"] == "context_length_exceeded"


"""bench/vs_gateways.py's plumbing on a tiny setting: the fake upstream answers the same scripted tool session on
both APIs (SGLang /generate for SeamlessFlow, vLLM-style chat with token ids for the peers), so every gateway
carries the same work, and the bench's sessions run their tool turns to the answer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import parse_tool_calls
from inference_svc.default_model import DefaultModelSpec, create_default_model
from tests.unit.bench.bench_modules import load_bench, post_asgi

pytestmark = pytest.mark.unit

load_bench("proxy_floor")  # fake_upstream and adapter_bench import it from their own directory
fake_upstream = load_bench("fake_upstream")
load_bench("proxy_steps")
load_bench("adapter_bench")  # vs_gateways imports its helpers from its own directory
vs_gateways = load_bench("vs_gateways")
TOOL_TURNS = 2


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> ChatCodec:
    spec = DefaultModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, seed=0)
    return ChatCodec.from_model_dir(create_default_model(tmp_path_factory.mktemp("vs-gateways"), spec))


def _post(app: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = post_asgi(app, path, body)  # the fake's fixed latency is 0 here
    assert status == 200
    return reply


def test_both_apis_answer_the_same_tool_session_with_the_same_ids(codec: ChatCodec) -> None:
    script = fake_upstream.Script(codec, TOOL_TURNS)
    app = fake_upstream.FakeUpstream(script, 0.0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": vs_gateways.SYSTEM},
                                      {"role": "user", "content": "What is 12 + 7?"}]
    for turn in range(TOOL_TURNS + 1):
        body = vs_gateways.chat_body("m", messages)
        prompt_ids = codec.encode(codec.render(messages, body["tools"]))
        native = _post(app, "/generate", {"input_ids": prompt_ids, "return_logprob": True})
        chat = _post(app, "/v1/chat/completions", {**body, "logprobs": True, "return_token_ids": True})
        choice = chat["choices"][0]
        assert chat["prompt_token_ids"] == prompt_ids  # what the peers record is what an engine would have seen
        assert native["output_ids"] == choice["token_ids"]
        versions = native["meta_info"]["output_token_versions"]
        assert versions == [fake_upstream.WEIGHT_VERSION] * len(choice["token_ids"])
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        text = codec.decode([i for i in native["output_ids"] if i not in codec.eos_token_ids])
        parsed = parse_tool_calls(text, codec.tool_call_style)
        if turn < TOOL_TURNS:  # a tool call, the same on both APIs
            assert parsed is not None and choice["finish_reason"] == "tool_calls"
            (native_call,), (chat_call,) = parsed[1], choice["message"]["tool_calls"]
            assert native_call["function"]["name"] == chat_call["function"]["name"] == "calculator"
            assert json.loads(native_call["function"]["arguments"]) == json.loads(chat_call["function"]["arguments"])
            messages += [choice["message"], vs_gateways.tool_result(chat_call)]
        else:  # then the answer
            assert parsed is None and choice["message"]["content"] == fake_upstream.ANSWER
            assert choice["finish_reason"] == "stop"


def test_sessions_run_their_tool_turns_to_the_answer(codec: ChatCodec) -> None:
    app = fake_upstream.FakeUpstream(fake_upstream.Script(codec, TOOL_TURNS), 0.0)

    async def turn(i: int, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
        reply = await asyncio.to_thread(_post, app, "/v1/chat/completions", vs_gateways.chat_body("m", messages))
        return reply["choices"][0]["message"], 1.0

    latencies, errors = asyncio.run(vs_gateways.run_sessions(3, turn, max_calls=10))
    assert (len(latencies), errors) == (3 * (TOOL_TURNS + 1), 0)


def test_each_gateway_is_called_on_its_own_route() -> None:
    def gateway(kind: str) -> Any:
        return vs_gateways.Gateway(kind, kind, "", psutil.Process(), "http://g", "chat", "", "")

    assert gateway("rllm").path("conc-0", 3) == ("http://g/sessions/conc-0-3/v1/chat/completions", {})
    url, headers = gateway("agl").path("conc-0", 3)
    assert url == "http://g/proxy/rollout/conc-0-3/attempt/0/mode/train/openai/v1/chat/completions"
    assert headers == {"Authorization": f"Bearer {vs_gateways.KEY}"}
    assert gateway("sflow").path("conc-0", 3) == (
        "http://g/v1/chat/completions", {"Authorization": f"Bearer {vs_gateways.KEY}", "X-Session-Id": "conc-0-3"})


def test_the_peer_python_search_starts_with_the_one_given(tmp_path: Path) -> None:
    assert vs_gateways.python312_candidates(str(tmp_path / "python3.12"))[0] == str(tmp_path / "python3.12")

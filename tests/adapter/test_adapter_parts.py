"""Config and keys, reply decoding (stop sequences, tool calls, logprobs), the example agent's pieces."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents_adapter.errors import ConfigError
from agents_adapter.proxy.__main__ import parse_config
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.config import AdapterConfig, StaticEndpoint, hash_api_key
from agents_adapter.proxy.openai_models import ChatCompletionRequest
from agents_adapter.proxy.outputs import chat_logprobs, finish_reply, parse_tool_calls
from agents_adapter.proxy.stitching import EngineRun, StitchedCall
from examples.calculator.agent import CalculatorAgent, EpisodeResult
from examples.calculator.tasks import make_arithmetic_tasks
from examples.calculator.tool import CalculatorError, evaluate, run_tool
from examples.calculator.verifier import verify

pytestmark = pytest.mark.unit
IM_END = 258


# ----- config


def test_keys_are_kept_hashed_from_file_and_env(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# agents\nagent-a sha256:{hash_api_key('key-a')}\nagent-b key-b  # clear keys are hashed\n")
    config = AdapterConfig.build(env={"SFLOW_ADAPTER_API_KEYS": "agent-c=key-c", "SFLOW_ADAPTER_ADMIN_KEY": "adm"},
                                 model_path=tiny_model_dir, api_keys_file=keys)
    assert config.agent_keys == {hash_api_key("key-a"): "agent-a", hash_api_key("key-b"): "agent-b",
                                 hash_api_key("key-c"): "agent-c"}
    assert config.admin_key_sha256 == hash_api_key("adm")
    dumped = json.dumps(config.redacted())
    assert "key-b" not in dumped and hash_api_key("key-b") not in dumped
    assert config.host == "127.0.0.1" and config.model_name == tiny_model_dir.name


@pytest.mark.parametrize(("values", "env", "message"), [
    ({"port": 70000}, {}, "port"),
    ({"session_cache_size": 0}, {}, "session_cache_size"),
    ({"inference_endpoints": ["r=ftp://x"]}, {}, "ftp://x"),
    ({"inference_endpoints": ["a=http://x:1", "a=http://y:1"]}, {}, "duplicate"),
    ({}, {"SFLOW_ADAPTER_API_KEYS": "agent-a"}, "AGENT_ID=KEY"),
    ({}, {"SFLOW_ADAPTER_API_KEYS": "a=k,b=k"}, "same"),
    ({}, {"SFLOW_ADAPTER_API_KEYS": "a=sha256:1234"}, "64 hex"),
    ({"max_prompt_tokens": 100, "max_context_tokens": 50}, {}, "max_prompt_tokens"),
])
def test_bad_config_names_the_field(tiny_model_dir: Path, values: dict[str, Any], env: dict[str, str],
                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AdapterConfig.build(env=env, model_path=tiny_model_dir, **values)


def test_missing_model_dir_and_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_path"):
        AdapterConfig.build(env={}, model_path=tmp_path / "nope")
    with pytest.raises(ConfigError, match="api_keys_file"):
        AdapterConfig.build(env={}, model_path=tmp_path, api_keys_file=tmp_path / "missing")


def test_static_endpoint_specs() -> None:
    assert StaticEndpoint.parse("r1=http://127.0.0.1:5/", 0) == StaticEndpoint(resource_id="r1", url="http://127.0.0.1:5")
    assert StaticEndpoint.parse("http://h:1", 3).resource_id == "static-3"


def test_command_line(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_config(["--hash-key", "secret"]) is None
    assert capsys.readouterr().out.strip() == f"sha256:{hash_api_key('secret')}"
    config = parse_config(["--model-path", str(tiny_model_dir), "--endpoint", "r0=http://127.0.0.1:9",
                           "--port", "0", "--no-routing-from-events", "--bootstrap-servers", "127.0.0.1:1",
                           "--topic-prefix", "x."])
    assert config is not None and not config.routing_from_events and config.bus.topic("llm.calls") == "x.llm.calls"
    assert config.inference_endpoints[0].resource_id == "r0"
    with pytest.raises(SystemExit):
        parse_config(["--model-path", str(tiny_model_dir), "--max-n", "0"])


# ----- replies


def finished(output: list[int], finish: str = "stop") -> StitchedCall:
    call = StitchedCall([1], max_new_tokens=256)
    call.add("r", EngineRun(output, [-1.0] * len(output), [0] * len(output), finish, 0), 0, 1)
    return call


def test_stop_token_is_recorded_but_not_shown(codec: ChatCodec) -> None:
    call = finished([*codec.encode("hello"), IM_END])
    reply = finish_reply(codec, "c", call, stops=(), stop_token_ids=(), parse_tools=False)
    assert reply.text == "hello" and reply.finish_reason == "stop" and call.output_ids[-1] == IM_END


def test_stop_sequence_cuts_text_and_record(codec: ChatCodec) -> None:
    call = finished([*codec.encode("one. two. three"), IM_END])
    reply = finish_reply(codec, "c", call, stops=["two", "thr"], stop_token_ids=(), parse_tools=False)
    assert reply.text == "one. " and reply.finish_reason == "stop"
    assert codec.decode(call.output_ids) == "one. two"  # the tokens up to the one completing the stop
    assert len(call.logprobs) == len(call.output_ids) == call.segments[0].num_tokens


def test_tool_calls_parsed_only_when_well_formed(codec: ChatCodec) -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    reply = finish_reply(codec, "c", finished([*codec.encode(text), IM_END]), stops=(), stop_token_ids=(),
                         parse_tools=True)
    assert reply.finish_reason == "tool_calls" and reply.text == "Let me compute."
    assert reply.tool_calls is not None and reply.tool_calls[0]["function"] == {
        "name": "calculator", "arguments": '{"expression": "2+3"}'}
    assert reply.message()["tool_calls"] == reply.tool_calls
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") is None
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>') is None
    assert parse_tool_calls('<tool_call>{"name": "f"') is None  # cut by max_tokens: plain text
    no_tools = finish_reply(codec, "c", finished(codec.encode(text)), stops=(), stop_token_ids=(), parse_tools=False)
    assert no_tools.tool_calls is None and no_tools.text == text and no_tools.finish_reason == "stop"


def test_chat_logprobs_have_token_bytes(codec: ChatCodec) -> None:
    reply = finish_reply(codec, "c", finished([0xC3, 0xA9, 65, IM_END]), stops=(), stop_token_ids=(),
                         parse_tools=False)
    content = chat_logprobs(codec, reply, top_logprobs=2)["content"]
    assert [c["bytes"] for c in content] == [[0xC3], [0xA9], [65]]
    assert bytes(b for c in content for b in c["bytes"]).decode() == "éA"
    assert content[0]["top_logprobs"] == [{k: v for k, v in content[0].items() if k != "top_logprobs"}]


def test_unsupported_options_are_refused_by_name() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for field, value in [("presence_penalty", 0.5), ("logit_bias", {"1": 2}), ("top_logprobs", 2)]:
        with pytest.raises(Exception, match=field):
            ChatCompletionRequest.model_validate(base | {field: value}).check_supported()
    ChatCompletionRequest.model_validate(base | {"presence_penalty": 0, "store": True}).check_supported()


# ----- the example agent


def test_calculator_is_safe_arithmetic() -> None:
    assert evaluate("(12 + 7) * 3 - 2**3") == 49.0
    assert evaluate("-4 // 3 % 5") == 3.0
    for bad in ["__import__('os')", "1/0", "9**9**9", "x + 1", "1" * 300, "[1, 2]", "True + 1"]:
        with pytest.raises(CalculatorError):
            evaluate(bad)


def test_tasks_and_verifier() -> None:
    tasks = make_arithmetic_tasks(5, seed=3)
    assert tasks == make_arithmetic_tasks(5, seed=3) and len({t.task_id for t in tasks}) == 5
    for task in tasks:
        assert evaluate(task.question.removeprefix("What is ").removesuffix("?")) == task.answer
    task = tasks[0]
    assert verify(f"The answer is {int(task.answer)}", task) == 1.0
    assert verify(f"{int(task.answer) + 1}", task) == 0.0
    assert verify("\ufffd garbage", task) == 0.0


def test_tool_runner_never_raises() -> None:
    assert run_tool("calculator", '{"expression": "6*7"}') == ("42", True)
    assert run_tool("calculator", '{"expression": "1/4"}') == ("0.25", True)
    assert run_tool("search", "{}")[1] is False
    assert run_tool("calculator", "not json")[1] is False
    assert run_tool("calculator", '{"expr": "1"}')[1] is False
    assert run_tool("calculator", '{"expression": "1/0"}')[1] is False


def test_agent_turn_logic_on_served_messages() -> None:
    agent = CalculatorAgent("m", max_turns=2)
    task = make_arithmetic_tasks(1)[0]
    messages = agent.first_messages(task)
    result = EpisodeResult("s", task.task_id)
    arguments = '{"expression": "1+1"}'
    call = SimpleNamespace(id="call_1", function=SimpleNamespace(name="calculator", arguments=arguments),
                           model_dump=lambda **_: {"id": "call_1", "type": "function",
                                                   "function": {"name": "calculator", "arguments": arguments}})
    assert not agent._observe(result, messages, SimpleNamespace(content=None, tool_calls=[call]))
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "2"}
    assert agent._observe(result, messages, SimpleNamespace(content="2", tool_calls=None))
    assert result.answered and result.answer == "2" and result.turns == 2 and result.tool_calls == 1
    stuck = EpisodeResult("s", task.task_id)
    agent._observe(stuck, messages, SimpleNamespace(content=None, tool_calls=[call]))
    assert agent._observe(stuck, messages, SimpleNamespace(content=None, tool_calls=[call]))  # max_turns reached
    assert not stuck.answered

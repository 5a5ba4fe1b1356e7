"""Forced tool calls and response formats served end to end, through the official clients of each API:
the random-weights model's replies are always the call or the JSON asked for, and recorded as usual."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import jsonschema
import pytest

from bus.config import BusConfig
from schemas import events as ev
from tests.adapter.support import engine_inputs
from tests.adapter.test_adapter_service import Proxy, recorded, start_proxy  # noqa: F401 (fixture)

pytestmark = pytest.mark.kafka

# bounded (lengths, enum), so a random-weights model always finishes the call within the budget
ARGS: Any = {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 12},
                                              "precision": {"enum": ["int", "float"]}}, "required": ["expression"]}
TOOLS: Any = [{"type": "function", "function": {"name": "calculator", "parameters": ARGS}},
              {"type": "function", "function": {"name": "give_up", "parameters": {"type": "object", "properties": {}}}}]
ANSWER: Any = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}},
               "required": ["answer"], "additionalProperties": False}
ASK: Any = [{"role": "user", "content": "6*7?"}]


def test_every_api_serves_forced_calls_and_formats(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = engine_inputs(engine_a[1], monkeypatch)
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    chat = proxy.client(session="forced").chat.completions
    forced: list[tuple[Any, set[str]]] = [("required", {"calculator", "give_up"}),
                                          ({"type": "function", "function": {"name": "calculator"}}, {"calculator"})]
    for seed in range(3):
        for choice, names in forced:
            reply = chat.create(model=proxy.model, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=300,
                                seed=seed)
            assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.tool_calls
            for call in reply.choices[0].message.tool_calls:
                function: Any = call.function  # type: ignore[union-attr]
                assert function.name in names
                jsonschema.validate(json.loads(function.arguments),
                                    ARGS if function.name == "calculator" else {"maxProperties": 0})
        formatted = chat.create(model=proxy.model, messages=ASK, max_tokens=60, seed=seed, response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}})
        jsonschema.validate(json.loads(formatted.choices[0].message.content or ""), ANSWER)
    any_json = chat.create(model=proxy.model, messages=ASK, max_tokens=300, seed=1,
                           response_format={"type": "json_object"})
    assert any_json.choices[0].finish_reason in ("stop", "length")  # an open object may run to the budget

    messages = anthropic.Anthropic(base_url=proxy.url, api_key="key-a", max_retries=0,
                                   default_headers={"X-Session-Id": "forced-messages"}).messages
    tool: Any = {"name": "calculator", "input_schema": ARGS}
    anthropic_choices: list[Any] = [{"type": "any"},
                                    {"type": "tool", "name": "calculator", "disable_parallel_tool_use": True}]
    for anthropic_choice in anthropic_choices:
        message = messages.create(model=proxy.model, max_tokens=300, messages=ASK, tools=[tool],
                                  tool_choice=anthropic_choice)
        uses = [b for b in message.content if b.type == "tool_use"]
        assert message.stop_reason == "tool_use" and uses and all(b.name == "calculator" for b in uses)
        jsonschema.validate(uses[0].input, ARGS)

    responses = proxy.client(session="forced-responses").responses
    response = responses.create(model=proxy.model, input="6*7?", tool_choice="required", max_output_tokens=300,
                                parallel_tool_calls=False,
                                tools=[{"type": "function", "name": "calculator", "parameters": ARGS, "strict": False}])
    assert [item.type for item in response.output] == ["function_call"]
    formatted_response = responses.create(model=proxy.model, input="6*7?", max_output_tokens=60, text={
        "format": {"type": "json_schema", "name": "answer", "schema": ANSWER}})
    jsonschema.validate(json.loads(formatted_response.output_text), ANSWER)
    assert formatted_response.text.format.type == "json_schema"  # type: ignore[union-attr]

    calls = [c for c in recorded(bus_config, "llm.calls", ev.LLMCall) if c.session_id.startswith("forced")]
    assert len(calls) == 3 * 3 + 1 + 2 + 2
    for call in calls:  # recorded as any call: the prompt the engine read, the tokens it wrote
        engine_input, future = seen[f"{call.call_id}-0"]
        assert list(call.prompt_ids) == engine_input and list(call.output_ids) == future.result().output_ids

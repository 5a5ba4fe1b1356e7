"""The Responses and Messages APIs on the capture proxy, through the official `openai` and `anthropic` clients.

Unit part: a reply with a tool call goes out in each API's shape, is read by the SDK's own types (and
its stream accumulator), comes back as the agent echoes it and translates to the very message the chat
pipeline served (what token-in/token-out keys the call under). Kafka part: chat, completions, responses
(continued by `previous_response_id`, streamed) and messages (streamed and not) sessions through a
proxy on the native engine, each call recorded as an `LLMCall` continuing the previous one, and the
trajectory processor (a Faust worker) making one single-path trajectory per session.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agents_adapter.proxy.anthropic_api import MessagesRequest, chat_messages, message_body, message_events
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import Reply, finish_reply
from agents_adapter.proxy.responses_api import ResponsesRequest, input_messages, response_body, response_events
from agents_adapter.proxy.service import Served
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import canonical_message
from bus.config import BusConfig
from schemas import events as ev
from tests.adapter.test_adapter_service import CALCULATOR, Proxy, echo, recorded, start_proxy  # noqa: F401 (fixture)
from tests.kafka.test_trajectory_processor import Worker, wait_for_trajectories

ANTHROPIC_TOOL: Any = {"name": "calculator", "description": "evaluates arithmetic",
                       "input_schema": CALCULATOR["function"]["parameters"]}
RESPONSES_TOOL: Any = {"type": "function", "name": "calculator", "parameters": CALCULATOR["function"]["parameters"]}


def tool_reply(codec: ChatCodec) -> Reply:
    """A served reply holding a tool call, as the engine's tokens of it are finished for the agent."""
    output = codec.encode('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}'
                          "</tool_call>")
    call = StitchedCall([1, 2, 3], 64, list(output), [-0.5] * len(output), [0] * len(output), [], "stop")
    return finish_reply(codec, "c0ffee", call, stops=(), stop_token_ids=(), parse_tools=True)


@pytest.mark.unit
def test_a_tool_call_round_trips_through_the_anthropic_types_and_back_to_the_served_message(codec: ChatCodec) -> None:
    reply = tool_reply(codec)
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8,
                                          "messages": [{"role": "user", "content": "q"}]})
    body = message_body(codec, req, Served("x", "s", [reply], 3, {}, {}))
    message = anthropic.types.Message.model_validate(body)
    text, tool = message.content
    assert isinstance(text, anthropic.types.TextBlock) and text.text == "Let me compute."
    assert isinstance(tool, anthropic.types.ToolUseBlock) and tool.input == {"expression": "6*7"}
    assert (message.stop_reason, message.usage.output_tokens) == ("tool_use", len(reply.call.output_ids))
    snapshot = None
    for _, event in message_events(body):  # the SDK's own stream accumulator rebuilds the same message
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs={})  # type: ignore[arg-type]
    assert snapshot is not None and snapshot.stop_reason == "tool_use"
    assert [b.to_dict(exclude_none=True) for b in snapshot.content] == [b.to_dict() for b in message.content]
    again = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "system": "calc", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "42"},
                                     {"type": "text", "text": "and "}, {"type": "text", "text": "now?"}]},
    ]})
    system, user, assistant, result, follow = chat_messages(again)
    assert canonical_message(assistant) == canonical_message(reply.message())
    assert (system, user) == ({"role": "system", "content": "calc"}, {"role": "user", "content": "q"})
    assert result == {"role": "tool", "tool_call_id": tool.id, "content": "42"}
    assert follow == {"role": "user", "content": "and now?"}


@pytest.mark.unit
def test_a_tool_call_round_trips_through_the_responses_types_and_back_to_the_served_message(codec: ChatCodec) -> None:
    reply = tool_reply(codec)
    req = ResponsesRequest.model_validate({"model": "m", "input": "q", "tools": [RESPONSES_TOOL]})
    body = response_body(req, Served("resp_1", "s", [reply], 3, {}, {}))
    response = Response.model_validate(body)
    _, call = response.output
    assert response.output_text == "Let me compute." and response.status == "completed"
    assert call.type == "function_call" and json.loads(call.arguments) == {"expression": "6*7"}
    events = [TypeAdapter(ResponseStreamEvent).validate_python(e) for _, e in response_events(body)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and events[-1].response == response
    deltas = [e.delta for e in events if e.type in ("response.output_text.delta",
                                                    "response.function_call_arguments.delta")]
    assert deltas == ["Let me compute.", call.arguments]
    again = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "q"}, *[item.model_dump(exclude_none=True) for item in response.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]})
    user, assistant, result = input_messages(again.input)
    assert canonical_message(assistant) == canonical_message(reply.message()) and user["content"] == "q"
    assert result == {"role": "tool", "tool_call_id": call.call_id, "content": "42"}


# ------------------------------------------------------------------------- through the proxy, on Kafka


def chat_session(proxy: Proxy, sid: str) -> None:
    client = proxy.client(session=sid)
    messages: list[Any] = [{"role": "user", "content": "1+1?"}]
    for turn in range(2):
        reply = client.chat.completions.create(model=proxy.model, messages=messages, tools=[CALCULATOR], max_tokens=4)
        messages += [echo(reply.choices[0].message), {"role": "user", "content": f"and {turn}?"}]


def completions_session(proxy: Proxy, sid: str) -> None:
    client = proxy.client(session=sid)
    prompt = "Q: 2+2\nA:"
    for _ in range(2):
        prompt += client.completions.create(model=proxy.model, prompt=prompt, max_tokens=4).choices[0].text + "\nQ:"


def responses_session(proxy: Proxy, sid: str) -> None:
    """Opened by X-Session-Id with a tool call in its context; continued by previous_response_id alone
    (no session header), the last turn streamed."""
    client = proxy.client()
    first = client.responses.create(
        model=proxy.model, instructions="You compute.", tools=[RESPONSES_TOOL], max_output_tokens=4,
        extra_headers={"X-Session-Id": sid}, input=[
            {"role": "user", "content": "6*7?"},
            {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression":"6*7"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {"role": "user", "content": [{"type": "input_text", "text": "so?"}]}])
    second = client.responses.create(model=proxy.model, instructions="You compute.", tools=[RESPONSES_TOOL],
                                     previous_response_id=first.id, input="and 6*8?", max_output_tokens=4)
    assert second.previous_response_id == first.id and second.usage is not None
    events = list(client.responses.create(model=proxy.model, instructions="You compute.", tools=[RESPONSES_TOOL],
                                          previous_response_id=second.id, input="thanks", max_output_tokens=4,
                                          stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]  # response.incomplete when the 4 tokens ran out, as OpenAI streams it
    assert last.type in ("response.completed", "response.incomplete") and last.response.status == last.type[9:]
    assert last.response.output_text == deltas and last.response.previous_response_id == second.id


def messages_session(proxy: Proxy, sid: str) -> None:
    """Named by metadata.user_id (no session header), a tool_use / tool_result exchange in its context;
    the first turn answered whole, the second streamed."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key="key-a", max_retries=0, timeout=120)
    messages: list[Any] = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Computing."}, {
            "type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "6*7"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]},
    ]
    first = client.messages.create(model=proxy.model, max_tokens=4, system="You compute.", tools=[ANTHROPIC_TOOL],
                                   messages=messages, metadata={"user_id": sid})
    assert first.stop_reason in ("end_turn", "max_tokens") and first.usage.output_tokens >= 1
    messages += [{"role": "assistant", "content": [b.to_dict() for b in first.content]},
                 {"role": "user", "content": "and 6*8?"}]
    with client.messages.stream(model=proxy.model, max_tokens=4, system="You compute.", tools=[ANTHROPIC_TOOL],
                                messages=messages, metadata={"user_id": sid}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == streamed  # type: ignore[union-attr]


@pytest.mark.kafka
def test_official_sdk_sessions_are_recorded_and_each_becomes_one_trajectory(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any], tmp_path: Path,  # noqa: F811
) -> None:
    worker = Worker(bus_config, tmp_path / "data", tmp_path / "worker.log")
    worker.start()  # it starts while the calls run
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    shapes = {"sdk-chat": (chat_session, 2), "sdk-completions": (completions_session, 2),
              "sdk-responses": (responses_session, 3), "sdk-messages": (messages_session, 2)}
    for sid, (run, _) in shapes.items():
        run(proxy, sid)
        ended = httpx.post(f"{proxy.url}/v1/sessions/{sid}/end", json={"reward": 1.0},
                           headers={"Authorization": "Bearer key-a"})
        assert ended.status_code == 200, ended.text
    calls: dict[str, list[ev.LLMCall]] = {}
    for call in recorded(bus_config, "llm.calls", ev.LLMCall):
        calls.setdefault(call.session_id, []).append(call)
    assert {sid: len(c) for sid, c in calls.items()} == {sid: n for sid, (_, n) in shapes.items()}
    try:
        worker.wait_ready()
        trajectories = wait_for_trajectories(bus_config, set(shapes), worker)
    finally:
        worker.stop()
    for sid, session_calls in calls.items():
        session_calls.sort(key=lambda c: c.turn)
        for previous, call in itertools.pairwise(session_calls):  # token-in/token-out
            history = [*previous.prompt_ids, *previous.output_ids]
            assert call.parent_call_id == previous.call_id and not call.drift, sid
            assert list(call.prompt_ids[: len(history)]) == history, sid
        trajectory, last = trajectories[sid], session_calls[-1]
        assert trajectory.call_ids == tuple(c.call_id for c in session_calls) and trajectory.drift_calls == 0
        assert [n.parent for n in trajectory.nodes] == list(range(-1, len(trajectory.nodes) - 1)), sid  # one path
        assert [t for n in trajectory.nodes for t in n.token_ids] == [*last.prompt_ids, *last.output_ids], sid
        assert (trajectory.reward, trajectory.agent_id) == (1.0, "agent-a")


@pytest.mark.kafka
def test_bad_requests_get_a_4xx_in_the_proxy_error_shape(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
) -> None:
    proxy = start_proxy(bus_config, (f"rollout-a={engine_a[0]}",))
    first = proxy.client(session="mine").responses.create(model=proxy.model, input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError) as missing:
        proxy.client().responses.create(model=proxy.model, input="hi", previous_response_id="resp_none")
    assert missing.value.code == "previous_response_not_found" and missing.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):  # another agent's response is not told apart from a missing one
        proxy.client(key="key-b").responses.create(model=proxy.model, input="hi", previous_response_id=first.id)
    anthropic_client = anthropic.Anthropic(base_url=proxy.url, api_key="key-a", max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client.messages.create(model=proxy.model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    text = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, dict[str, Any], dict[str, str], int, str | None]] = [
        ("/v1/responses", {"model": proxy.model, "input": "x", "previous_response_id": first.id},
         {"X-Session-Id": "other"}, 400, "previous_response_id"),
        ("/v1/responses", {"model": proxy.model, "input": [{"type": "reasoning", "summary": []}]}, {}, 400, "input.0"),
        ("/v1/responses", {"model": proxy.model, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]}, {}, 400, "input.0"),
        ("/v1/responses", {"model": proxy.model, "input": "x", "tools": [{"type": "web_search"}]}, {}, 400,
         "tools.0.type"),
        ("/v1/responses", {"model": proxy.model, "input": "x", "tool_choice": "required"}, {}, 400, "tool_choice"),
        ("/v1/responses", {"model": "gpt-x", "input": "x"}, {}, 404, "model"),
        ("/v1/messages", {"model": proxy.model, "messages": text}, {}, 400, "max_tokens"),
        ("/v1/messages", {"model": proxy.model, "max_tokens": 2, "messages": text, "tool_choice": {"type": "any"}},
         {}, 400, "tool_choice"),
        ("/v1/messages", {"model": proxy.model, "max_tokens": 2, "messages": [{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "1"}]}]}, {}, 400, "messages.0.content"),
        ("/v1/messages", {"model": proxy.model, "max_tokens": 2, "messages": text}, {"x-api-key": "nope"}, 401, None),
    ]
    for path, body, headers, status, param in cases:
        key = None if "x-api-key" in headers else "key-a"
        answer = proxy.post(path, body, key=key, **headers)
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (status, param), (path, body, answer.text)
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    by_header = proxy.post("/v1/messages", {"model": proxy.model, "max_tokens": 2, "messages": text}, key=None,
                           **{"x-api-key": "key-a", "X-Session-Id": "keyed"})
    assert by_header.status_code == 200 and by_header.headers["X-Session-Id"] == "keyed"
    assert by_header.json()["type"] == "message"

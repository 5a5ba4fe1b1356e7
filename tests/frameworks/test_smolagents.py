"""Stock smolagents agents (`ToolCallingAgent`, `CodeAgent`, default settings) through the capture proxy.

The agent is pointed at the proxy as a user would: `OpenAIModel(api_base=<proxy>/v1, api_key=...)` and
the session header through its client options. `ToolCallingAgent` asks for `tool_choice: "required"`
(served by constrained decoding) and `CodeAgent` sends an ~8.7K-token system prompt (served by the 32K
context). The model is the random-weights default model, so what the agent makes of the replies is not
asserted (its code never runs; a step may fail to parse and the agent goes on to its next step or its
final answer): what the proxy guarantees is. Every request is answered (no 4xx), every call is recorded
once on `llm.calls` with the prompt the engine read and the tokens it wrote, each forced tool call is a
parseable call of one of the agent's tools, and the session becomes a trajectory holding every call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import smolagents
from smolagents import CodeAgent, OpenAIModel, ToolCallingAgent, tool

from bus.config import BusConfig
from schemas import events as ev
from tests.adapter.support import engine_inputs
from tests.adapter.test_adapter_service import Proxy, recorded, start_proxy  # noqa: F401 (fixture)
from tests.kafka.test_trajectory_processor import Worker, wait_for_trajectories

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


@tool
def get_weather(city: str) -> str:
    """Tells the weather in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


class Exchanges:
    """The agent's HTTP exchanges with the proxy, seen through its client's own event hook."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any], dict[str, Any]]] = []

    def hook(self, response: httpx.Response) -> None:
        response.read()
        request = json.loads(response.request.content or b"{}")
        self.answers.append((response.status_code, request, response.json()))


def smolagents_model(proxy: Proxy, session: str, exchanges: Exchanges) -> OpenAIModel:
    client = httpx.Client(event_hooks={"response": [exchanges.hook]}, timeout=600)
    return OpenAIModel(model_id=proxy.model, api_base=f"{proxy.url}/v1", api_key="key-a",
                       client_kwargs={"default_headers": {"X-Session-Id": session}, "http_client": client})


def run_agent(agent: Any, task: str) -> str:
    """Runs the stock agent; its own errors (a reply that does not parse) are the random model's, not ours."""
    try:
        return f"answered: {agent.run(task)!r}"[:200]
    except smolagents.utils.AgentError as e:
        return f"agent error: {e}"[:200]


def served_and_recorded(bus: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, session: str,
                        make_agent: Callable[[OpenAIModel], Any]) -> tuple[Exchanges, list[ev.LLMCall]]:
    """Runs a stock agent through the proxy and checks what the proxy guarantees, whatever the agent made
    of the replies: every request answered, every call recorded once with the engine's own input and
    output, the session a trajectory of those calls."""
    print(f"smolagents {smolagents.__version__}")
    worker = Worker(bus, tmp_path / "data", tmp_path / "worker.log")
    worker.start()
    seen = engine_inputs(engine_a[1], monkeypatch)
    proxy = start_proxy(bus, (f"rollout-a={engine_a[0]}",))
    exchanges = Exchanges()
    agent = make_agent(smolagents_model(proxy, session, exchanges))
    try:
        print(run_agent(agent, "What is the weather in Paris?"))
        statuses = [status for status, _, _ in exchanges.answers]
        assert exchanges.answers and set(statuses) == {200}, [a for a in exchanges.answers if a[0] != 200]
        calls = sorted((c for c in recorded(bus, "llm.calls", ev.LLMCall) if c.session_id == session),
                       key=lambda c: c.turn)
        assert len(calls) == len(exchanges.answers) == len({c.call_id for c in calls})  # each recorded once
        for call in calls:
            engine_input, future = seen[f"{call.call_id}-0"]
            assert list(call.prompt_ids) == engine_input  # the recorded prompt is what the engine read
            assert list(call.output_ids) == future.result().output_ids  # and the tokens it wrote
        ended = httpx.post(f"{proxy.url}/v1/sessions/{session}/end", json={"reward": 0.0},
                           headers={"Authorization": "Bearer key-a"})
        assert ended.status_code == 200, ended.text
        worker.wait_ready()
        trajectory = wait_for_trajectories(bus, {session}, worker)[session]
        assert set(trajectory.call_ids) == {c.call_id for c in calls}
    finally:
        worker.stop()
    return exchanges, calls


def test_stock_tool_calling_agent_gets_forced_tool_calls(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    exchanges, _ = served_and_recorded(bus_config, start_proxy, engine_a, monkeypatch, tmp_path, "smol-tools",
                                       lambda model: ToolCallingAgent(tools=[get_weather], model=model, max_steps=3))
    forced = [(request, body) for _, request, body in exchanges.answers if request.get("tool_choice") == "required"]
    assert forced, "the stock ToolCallingAgent asks for tool_choice='required'"
    tool_names = {"get_weather", "final_answer"}
    for request, body in forced:
        assert {t["function"]["name"] for t in request["tools"]} == tool_names
        message = body["choices"][0]["message"]
        if body["choices"][0]["finish_reason"] == "tool_calls":  # else the budget cut the call short
            assert message["tool_calls"] and {c["function"]["name"] for c in message["tool_calls"]} <= tool_names
            for call in message["tool_calls"]:
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
    print(f"forced calls: {len(forced)}, finished as tool calls: "
          f"{sum(b['choices'][0]['finish_reason'] == 'tool_calls' for _, b in forced)}")


def test_stock_code_agent_with_its_long_system_prompt_is_served(
    bus_config: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    _, calls = served_and_recorded(bus_config, start_proxy, engine_a, monkeypatch, tmp_path, "smol-code",
                                   lambda model: CodeAgent(tools=[get_weather], model=model, max_steps=2))
    assert len(calls[0].prompt_ids) > 4096  # the old context would have refused it
    print(f"calls: {len(calls)}, prompt tokens: {[len(c.prompt_ids) for c in calls]}")

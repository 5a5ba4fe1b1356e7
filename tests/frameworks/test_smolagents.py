"""Stock smolagents agents (`ToolCallingAgent`, `CodeAgent`, default settings) through the capture proxy.

The agent is pointed at the proxy as a user would: `OpenAIModel(api_base=<proxy>/v1, api_key=...)` and
the session header through its client options. `ToolCallingAgent` asks for `tool_choice: "required"`
(served by constrained decoding) and `CodeAgent` sends an ~8.7K-token system prompt (served by the 32K
context). The model is the random-weights default model, so what the agent makes of the replies is not
asserted (its code never runs; a step may fail to parse and the agent goes on to its next step or its
final answer): what the proxy guarantees is. Every request is answered (no 4xx), every call is recorded
once on `llm.calls` with the prompt the engine read and the tokens it wrote, each forced tool call is a
parseable call of one of the agent's tools, the session becomes a trajectory holding every call, and drift
is flagged exactly where the agent rewrote history (`support.served_and_recorded`): `CodeAgent` sends its
replies back rewritten (the code block's closing tag appended, stripped), so its calls after the first
are drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import smolagents
from smolagents import CodeAgent, OpenAIModel, ToolCallingAgent, tool

from tests.adapter.test_adapter_service import Proxy
from tests.frameworks.support import KEY, Exchanges, ThroughProxy

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


@tool
def get_weather(city: str) -> str:
    """Tells the weather in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


def smolagents_model(proxy: Proxy, session: str, exchanges: Exchanges) -> OpenAIModel:
    return OpenAIModel(model_id=proxy.model, api_base=f"{proxy.url}/v1", api_key=KEY,
                       client_kwargs={"default_headers": {"X-Session-Id": session}, "http_client": exchanges.client()})


def driver(session: str, make_agent: Callable[[OpenAIModel], Any]) -> Callable[[Proxy, Exchanges], str]:
    """Runs the stock agent; its own errors (a reply that does not parse) are the random model's, not ours."""

    def drive(proxy: Proxy, exchanges: Exchanges) -> str:
        print(f"smolagents {smolagents.__version__}")
        agent = make_agent(smolagents_model(proxy, session, exchanges))
        try:
            return f"answered: {agent.run('What is the weather in Paris?')!r}"
        except smolagents.utils.AgentError as e:
            return f"agent error: {e}"

    return drive


def test_stock_tool_calling_agent_gets_forced_tool_calls(through_proxy: ThroughProxy) -> None:
    run = through_proxy("smol-tools", driver(
        "smol-tools", lambda model: ToolCallingAgent(tools=[get_weather], model=model, max_steps=3)))
    forced = [(a.request, a.body) for a in run.exchanges if a.request.get("tool_choice") == "required"]
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


def test_stock_code_agent_with_its_long_system_prompt_is_served(through_proxy: ThroughProxy) -> None:
    run = through_proxy("smol-code", driver(
        "smol-code", lambda model: CodeAgent(tools=[get_weather], model=model, max_steps=2)))
    assert len(run.calls[0].prompt_ids) > 4096  # the old context would have refused it
    assert run.drifted[1:] and all(run.drifted[1:])  # its replies come back rewritten

"""A stock openai-agents `Agent` with a function tool, run by `Runner.run` through the capture proxy, once
on `OpenAIResponsesModel` (the SDK's default) and once on `OpenAIChatCompletionsModel`.

Pointed at the proxy as a user would: an `AsyncOpenAI` client with the proxy's base URL, a key and the
`X-Session-Id` header. The first turn forces a tool call (`tool_choice: "required"`, served by constrained
decoding; the tool's one parameter is an enum, so the random model's call ends within `max_tokens`: it
takes ~80 tokens of the default tokenizer), so the agent runs its tool and sends the call and its result
back: the second call continues the first. The SDK then resets `tool_choice` to auto (its default
`reset_tool_choice`), and the random model's text ends the run. What the proxy guarantees is checked by
`support.served_and_recorded`; a reply cut by `max_tokens` on the Responses API comes back `status:
incomplete`, which this SDK raises on (as with OpenAI's own API): caught and said, the calls made are
still checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.exceptions import AgentsException

from tests.adapter.test_adapter_service import Proxy
from tests.frameworks.support import KEY, Exchanges, ThroughProxy

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


@function_tool
def get_weather(city: Literal["Paris", "London"]) -> str:
    """Tells the weather in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


def driver(session: str, model_class: type[OpenAIResponsesModel | OpenAIChatCompletionsModel],
           ) -> Callable[[Proxy, Exchanges], str]:
    def drive(proxy: Proxy, exchanges: Exchanges) -> str:
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0,
                                    default_headers={"X-Session-Id": session}, http_client=exchanges.async_client())
        agent = Agent(name="weather", instructions="You tell the weather.", tools=[get_weather],
                      model=model_class(model=proxy.model, openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", max_tokens=128))
        try:
            result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3,
                                            run_config=RunConfig(tracing_disabled=True)))
            return f"answered: {result.final_output!r}"
        except AgentsException as e:
            return f"agent error: {type(e).__name__}: {e}"

    return drive


@pytest.mark.parametrize("model_class", [OpenAIResponsesModel, OpenAIChatCompletionsModel],
                         ids=["responses", "chat"])
def test_openai_agents_runner_through_the_proxy(through_proxy: ThroughProxy, model_class: Any) -> None:
    session = f"oai-agents-{model_class.__name__}"
    run = through_proxy(session,
                              driver(session, model_class))
    assert len(run.calls) >= 2 and run.calls[1].parent_call_id == run.calls[0].call_id  # the tool turn continues

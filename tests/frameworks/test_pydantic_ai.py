"""A stock pydantic-ai `Agent` with a tool through the capture proxy, on its OpenAI chat model
(`OpenAIChatModel`) and its Responses model (`OpenAIResponsesModel`).

Pointed at the proxy as a user would: an `OpenAIProvider` over an `AsyncOpenAI` client with the proxy's base
URL, a key and the `X-Session-Id` header. The first step is given `tool_choice: "required"` (a per-step
model setting; served by constrained decoding, the tool's parameter an enum so a call of the random model
ends within `max_tokens`), so the agent runs its tool and sends the call and its result back; later steps
are auto, and the random model's text ends the run (or the request limit does: `AgentRunError`s, caught
and said). A second run goes on with the first's messages (`message_history`), its text answer included.

What the proxy guarantees is checked by `support.served_and_recorded`, drift included: with a history
processor (`ProcessHistory`) that keeps the last messages only (`chat-trimmed`, as pydantic-ai's docs
show one), the second run's prompts no longer extend what was served, and the proxy must flag exactly
those calls (and no others).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import openai
import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities.process_history import ProcessHistory
from pydantic_ai.exceptions import AgentRunError
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from tests.adapter.test_adapter_service import Proxy
from tests.frameworks.support import KEY, Exchanges, ThroughProxy

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


def get_weather(city: Literal["Paris", "London"]) -> str:
    """Tells the weather in a city."""
    return f"sunny in {city}"


def first_step_calls_the_tool(ctx: RunContext[None]) -> ModelSettings:
    """The model settings per step, as pydantic-ai lets an agent vary `tool_choice` (a static "required"
    it refuses, since the agent could never answer): forced on the first step, auto after."""
    return {"max_tokens": 128, "tool_choice": "required" if ctx.run_step <= 1 else "auto"}


async def keep_recent_messages(messages: list[ModelMessage]) -> list[ModelMessage]:
    """A history processor as pydantic-ai's docs show one (the last messages only): it rewrites history."""
    return messages[-3:]


def driver(session: str, model_class: type[OpenAIChatModel | OpenAIResponsesModel], trim: bool,
           ) -> Callable[[Proxy, Exchanges], str]:
    def drive(proxy: Proxy, exchanges: Exchanges) -> str:
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0,
                                    default_headers={"X-Session-Id": session}, http_client=exchanges.async_client())
        model = model_class(proxy.model, provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, instructions="You tell the weather.", tools=[get_weather],
                      model_settings=first_step_calls_the_tool,
                      capabilities=[ProcessHistory(keep_recent_messages)] if trim else [])
        limits = UsageLimits(request_limit=3)

        async def conversation() -> str:
            first = await agent.run("What is the weather in Paris?", usage_limits=limits)
            # the conversation goes on: the earlier run's messages (its text answer included) sent back
            second = await agent.run("And in London?", message_history=first.all_messages(), usage_limits=limits)
            return f"answered: {first.output!r}, then {second.output!r}"

        try:
            return asyncio.run(conversation())
        except AgentRunError as e:
            return f"agent error: {type(e).__name__}: {e}"

    return drive


@pytest.mark.parametrize(("model_class", "trim"), [(OpenAIChatModel, False), (OpenAIResponsesModel, False),
                                               (OpenAIChatModel, True)], ids=["chat", "responses", "chat-trimmed"])
def test_pydantic_ai_agent_through_the_proxy(through_proxy: ThroughProxy, model_class: Any, trim: bool) -> None:
    session = f"pydantic-ai-{model_class.__name__}-{trim}"
    run = through_proxy(session,
                              driver(session, model_class, trim))
    assert len(run.calls) >= 3
    if trim:  # the second run's calls lost the served replies' context: drift there, flagged by the proxy
        assert any(run.drifted) and not any(run.drifted[:2])

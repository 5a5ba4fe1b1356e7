"""A stock LangGraph agent (`create_react_agent` with langchain-openai's `ChatOpenAI`) through the capture
proxy, on chat completions and on the Responses API (`use_responses_api=True`).

Pointed at the proxy as a user would: `ChatOpenAI(base_url=<proxy>/v1, api_key=..., default_headers=
{"X-Session-Id": ...})`. The model is bound to its tool with `tool_choice="required"` (served by constrained
decoding; the tool's parameter is an enum so a call of the random model ends within `max_tokens`), so
every step calls the tool and the graph loops model -> tool -> model until its `recursion_limit` stops it
(`GraphRecursionError`, caught and said): each model call after the first sends the earlier calls and the
tool's results back. What the proxy guarantees is checked by `support.served_and_recorded`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from tests.adapter.test_adapter_service import Proxy
from tests.frameworks.support import KEY, Exchanges, ThroughProxy

pytestmark = [pytest.mark.frameworks, pytest.mark.kafka]


@tool
def get_weather(city: Literal["Paris", "London"]) -> str:
    """Tells the weather in a city."""
    return f"sunny in {city}"


def driver(session: str, responses: bool) -> Callable[[Proxy, Exchanges], str]:
    def drive(proxy: Proxy, exchanges: Exchanges) -> str:
        llm = ChatOpenAI(model=proxy.model, base_url=f"{proxy.url}/v1", api_key=KEY,  # type: ignore[arg-type]
                         default_headers={"X-Session-Id": session}, http_client=exchanges.client(),
                         max_tokens=128, max_retries=0, use_responses_api=responses)  # type: ignore[call-arg]
        agent = create_react_agent(llm.bind_tools([get_weather], tool_choice="required"), [get_weather])
        try:
            state = agent.invoke({"messages": [("user", "What is the weather in Paris?")]},
                                 {"recursion_limit": 5})
            return f"answered: {state['messages'][-1].content!r}"
        except GraphRecursionError as e:
            return f"graph stopped: {e}"

    return drive


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_langgraph_react_agent_through_the_proxy(through_proxy: ThroughProxy, responses: bool) -> None:
    session = f"langgraph-{'responses' if responses else 'chat'}"
    run = through_proxy(session,
                              driver(session, responses))
    assert len(run.calls) >= 2
    tool_turns = [a for a in run.exchanges if "tool" in str(a.request.get("messages", a.request.get("input")))]
    assert tool_turns, "the graph sent the tool's result back"

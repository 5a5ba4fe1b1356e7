"""The agent SDK: what an agent imports to be trained through the capture proxy.

It depends only on `openai` (no FastAPI, Kafka or torch), so an agent process stays light. The session classes
live in `agents_adapter.sdk.session`; these are the names an agent uses.
"""

from agents_adapter.sdk.session import (
    IDEMPOTENCY_HEADER,
    RETRY_BUDGET_S,
    AgentSession,
    AsyncAgentSession,
    report_reward_later,
    retries_covering,
    session_headers,
)

__all__ = ["IDEMPOTENCY_HEADER", "RETRY_BUDGET_S", "AgentSession", "AsyncAgentSession", "report_reward_later",
           "retries_covering", "session_headers"]

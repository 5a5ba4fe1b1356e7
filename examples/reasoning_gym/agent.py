"""The reasoning-gym example's agent: a stock openai-agents `Agent` with a calculator function tool.

The framework runs unmodified: `Runner.run` drives an `Agent` whose model is `OpenAIChatCompletionsModel`
over the `openai.AsyncOpenAI` client the rollout worker gives (already pointed at the capture proxy, so
every call the SDK makes is recorded for training). `GymAgent` only adapts it to the call the run makes
(`arun(client, task, session_id)`). The final output is the answer; the run's context (an
`EpisodeResult`) counts the calculator's calls and errors for the reward. An episode that the SDK ends by
raising (`max_turns` reached, a call of a tool that does not exist) is an unanswered episode, not an error:
an untrained model does both.
"""

from __future__ import annotations

from typing import Final

import openai
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, RunContextWrapper, Runner, function_tool
from agents.exceptions import AgentsException

from examples.calculator.agent import EpisodeResult
from examples.calculator.tool import CALCULATOR, CALCULATOR_TOOL, CalculatorError, evaluate, format_number
from examples.reasoning_gym.tasks import GymTask

INSTRUCTIONS: Final = (
    "You solve arithmetic problems. Call the calculator tool to compute, then reply with the final number only."
)


def _calculator(ctx: RunContextWrapper[EpisodeResult], expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. (12 + 7) * 3
    """
    episode = ctx.context
    episode.tool_calls += 1
    try:
        episode.last_tool_output = format_number(evaluate(expression))
    except CalculatorError as e:
        episode.tool_errors += 1
        episode.last_tool_output = ""
        return f"error: {e}"
    return episode.last_tool_output


def _tool_failed(ctx: RunContextWrapper[EpisodeResult], error: Exception) -> str:
    """Arguments the SDK could not parse: answered to the model, counted as a failed call."""
    ctx.context.tool_calls += 1
    ctx.context.tool_errors += 1
    ctx.context.last_tool_output = ""
    return f"error: {error}"


calculator = function_tool(_calculator, name_override=CALCULATOR,
                           description_override=CALCULATOR_TOOL["function"]["description"],
                           failure_error_function=_tool_failed)


class GymAgent:
    """The openai-agents agent, built per episode over the episode's client."""

    def __init__(self, model: str, *, max_turns: int = 3, max_tokens: int = 64, temperature: float = 1.0,
                 ignore_eos: bool = False) -> None:
        self.model = model
        self.max_turns = max_turns
        self.settings = ModelSettings(max_tokens=max_tokens, temperature=temperature,
                                      extra_body={"ignore_eos": True} if ignore_eos else None)

    def agent(self, client: openai.AsyncOpenAI) -> Agent[EpisodeResult]:
        return Agent(name="reasoning-gym", instructions=INSTRUCTIONS, tools=[calculator],
                     model=OpenAIChatCompletionsModel(model=self.model, openai_client=client),
                     model_settings=self.settings)

    async def arun(self, client: openai.AsyncOpenAI, task: GymTask, session_id: str = "") -> EpisodeResult:
        episode = EpisodeResult(session_id, task.task_id)
        try:
            result = await Runner.run(self.agent(client), task.question, context=episode, max_turns=self.max_turns,
                                      run_config=RunConfig(tracing_disabled=True))
        except AgentsException:
            return episode  # unanswered: max_turns reached, or a reply the SDK refused
        episode.answer, episode.answered = str(result.final_output or ""), True
        episode.turns = len(result.raw_responses)
        return episode

"""The calculator example's agent: multi-turn arithmetic with a calculator tool.

Each episode is one session with the capture proxy (`sdk.AgentSession`): the agent asks the model,
runs the calculator when the reply holds a tool call, sends the result back, and stops at the first
reply without a tool call (its text is the final answer) or after `max_turns`. The verifier gives
reward 1.0 when the last number of the answer equals the task's answer, else 0.0.

An untrained model mostly writes garbage: the agent must still run its turns cleanly (a malformed
tool call is answered with an error message, text is taken as the answer), so the proxy, the
trajectory processor and the trainer see real multi-turn sessions from the first step.

`python -m examples.calculator.agent --base-url http://127.0.0.1:8100/v1 --api-key KEY --model NAME`
runs a few episodes and prints their rewards.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any, Final

import openai

from agents_adapter.sdk import AgentSession, AsyncAgentSession
from examples.calculator.tasks import ArithmeticTask, make_arithmetic_tasks
from examples.calculator.tool import CALCULATOR_TOOL, run_tool
from examples.calculator.verifier import verify

SYSTEM_PROMPT: Final = (
    "You solve arithmetic problems. Call the calculator tool to compute, then reply with the final number only."
)


@dataclass
class EpisodeResult:
    session_id: str
    task_id: str
    answer: str = ""
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    answered: bool = False  # False: max_turns reached while the model was still calling tools
    last_tool_output: str = ""  # what the calculator returned last (empty after a tool error)


class CalculatorAgent:
    """The agent loop; `run` (sync client) and `arun` (async client) share `_observe`."""

    def __init__(self, model: str, *, max_turns: int = 4, max_tokens: int = 64, temperature: float = 1.0,
                 ignore_eos: bool = False) -> None:
        self.model = model
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.ignore_eos = ignore_eos  # vendor extension (SGLang, vLLM): fixed-length generations

    def first_messages(self, task: ArithmeticTask) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]

    def _request(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        request = {"model": self.model, "messages": messages, "tools": [CALCULATOR_TOOL],
                   "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.ignore_eos:
            request["extra_body"] = {"ignore_eos": True}
        return request

    def _observe(self, result: EpisodeResult, messages: list[dict[str, Any]], message: Any) -> bool:
        """Appends the reply (as served) and the tool results; True when the episode is over."""
        result.turns += 1
        calls = list(message.tool_calls or [])
        if not calls:
            messages.append({"role": "assistant", "content": message.content or ""})
            result.answer, result.answered = message.content or "", True
            return True
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [c.model_dump(exclude_none=True) for c in calls]})
        for call in calls:
            content, ok = run_tool(call.function.name, call.function.arguments)
            result.tool_calls += 1
            result.tool_errors += 0 if ok else 1
            result.last_tool_output = content if ok else ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return result.turns >= self.max_turns

    def run(self, client: openai.OpenAI, task: ArithmeticTask, session_id: str = "") -> EpisodeResult:
        result = EpisodeResult(session_id, task.task_id)
        messages = self.first_messages(task)
        done = False
        while not done:
            completion = client.chat.completions.create(**self._request(messages))
            done = self._observe(result, messages, completion.choices[0].message)
        return result

    async def arun(self, client: openai.AsyncOpenAI, task: ArithmeticTask, session_id: str = "") -> EpisodeResult:
        result = EpisodeResult(session_id, task.task_id)
        messages = self.first_messages(task)
        done = False
        while not done:
            completion = await client.chat.completions.create(**self._request(messages))
            done = self._observe(result, messages, completion.choices[0].message)
        return result



class DirectAgent(CalculatorAgent):
    """Single-turn: one reply with no tool offered, its text the answer (the seed paper's §5.1.1 setting;
    bench/vs_trl.py trains it against TRL). A reply that still writes a tool call answers nothing."""

    def _request(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        request = super()._request(messages)
        del request["tools"]
        return request

    def _observe(self, result: EpisodeResult, messages: list[dict[str, Any]], message: Any) -> bool:
        result.turns += 1
        result.answered = not message.tool_calls
        result.answer = (message.content or "") if result.answered else ""
        messages.append({"role": "assistant", "content": result.answer})
        return True

def run_episode(base_url: str, api_key: str, task: ArithmeticTask, agent: CalculatorAgent,
                group_id: str = "") -> EpisodeResult:
    """One session: run the agent, verify, report the reward (status failed if the agent raised)."""
    with AgentSession(base_url, api_key, task_id=task.task_id, group_id=group_id) as session:
        result = agent.run(session.client, task, session.session_id)
        result.reward = session.reward = verify(result.answer, task)
    return result


async def arun_episode(base_url: str, api_key: str, task: ArithmeticTask, agent: CalculatorAgent,
                       group_id: str = "") -> EpisodeResult:
    async with AsyncAgentSession(base_url, api_key, task_id=task.task_id, group_id=group_id) as session:
        result = await agent.arun(session.client, task, session.session_id)
        result.reward = session.reward = verify(result.answer, task)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.calculator.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the proxy's OpenAI base URL (…/v1)")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2, help="sessions per task (one GRPO group)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    agent = CalculatorAgent(args.model, max_turns=args.max_turns, max_tokens=args.max_tokens)

    async def run_all() -> list[EpisodeResult]:
        jobs = [
            arun_episode(args.base_url, args.api_key, task, agent, group_id=f"{task.task_id}-g")
            for task in make_arithmetic_tasks(args.episodes, args.seed)
            for _ in range(args.samples)
        ]
        return list(await asyncio.gather(*jobs))

    for r in asyncio.run(run_all()):
        print(f"{r.task_id} session={r.session_id} turns={r.turns} tool_calls={r.tool_calls} reward={r.reward}")


if __name__ == "__main__":
    main()

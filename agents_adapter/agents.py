"""An example agent: multi-turn arithmetic with a calculator tool, and its verifier.

Each episode is one session with the capture proxy (`sdk.AgentSession`): the agent asks the model,
runs the calculator when the reply holds a tool call, sends the result back, and stops at the first
reply without a tool call (its text is the final answer) or after `max_turns`. The verifier gives
reward 1.0 when the last number of the answer equals the task's answer, else 0.0.

An untrained model mostly writes garbage: the agent must still run its turns cleanly (a malformed
tool call is answered with an error message, text is taken as the answer), so the proxy, the
trajectory processor and the trainer see real multi-turn sessions from the first step.

`python -m agents_adapter.agents --base-url http://127.0.0.1:8100/v1 --api-key KEY --model NAME`
runs a few episodes and prints their rewards.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import math
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import openai

from agents_adapter.sdk import AgentSession, AsyncAgentSession

CALCULATOR: Final = "calculator"
CALCULATOR_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": CALCULATOR,
        "description": "Evaluate an arithmetic expression (+, -, *, /, //, %, **, parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (12 + 7) * 3"}},
            "required": ["expression"],
        },
    },
}
SYSTEM_PROMPT: Final = (
    "You solve arithmetic problems. Call the calculator tool to compute, then reply with the final number only."
)
_MAX_EXPRESSION: Final = 200
_MAX_POWER: Final = 64
_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?")
_BINARY: Final[dict[type, Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: Final[dict[type, Callable[[Any], Any]]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or cannot be computed."""


def evaluate(expression: str) -> float:
    """Computes an arithmetic expression without `eval` (numbers and + - * / // % ** only)."""
    if len(expression) > _MAX_EXPRESSION:
        raise CalculatorError(f"expression longer than {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {e.msg}") from e
    return float(_eval(tree.body))


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return float(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER:
            raise CalculatorError(f"exponent {right} is too large")
        try:
            value = float(_BINARY[type(node.op)](left, right))
        except (ZeroDivisionError, OverflowError) as e:
            raise CalculatorError(str(e)) from e
        if not math.isfinite(value):
            raise CalculatorError("result is not finite")
        return value
    raise CalculatorError(f"unsupported element {type(node).__name__}")


@dataclass(frozen=True)
class ArithmeticTask:
    task_id: str
    question: str
    answer: float


def make_arithmetic_tasks(n: int, seed: int = 0, max_operand: int = 99) -> list[ArithmeticTask]:
    """Two- and three-operand problems with integer answers."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        numbers = [rng.randint(1, max_operand) for _ in range(rng.choice((2, 3)))]
        ops = [rng.choice("+-*") for _ in numbers[1:]]
        expression = str(numbers[0]) + "".join(f" {op} {num}" for op, num in zip(ops, numbers[1:], strict=True))
        tasks.append(ArithmeticTask(f"arith-{seed}-{i}", f"What is {expression}?", evaluate(expression)))
    return tasks


def verify(answer: str, task: ArithmeticTask) -> float:
    """1.0 when the last number in the answer equals the task's answer."""
    numbers = _NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    return 1.0 if abs(float(numbers[-1]) - task.answer) < 1e-6 else 0.0


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


def run_tool(name: str, arguments: str) -> tuple[str, bool]:
    """(tool message content, ok) for one tool call; never raises."""
    if name != CALCULATOR:
        return f"error: unknown tool {name!r}; the only tool is {CALCULATOR!r}", False
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        return "error: arguments are not JSON", False
    expression = args.get("expression") if isinstance(args, dict) else None
    if not isinstance(expression, str):
        return "error: give {'expression': '<arithmetic>'}", False
    try:
        value = evaluate(expression)
    except CalculatorError as e:
        return f"error: {e}", False
    return (str(int(value)) if value.is_integer() else repr(value)), True


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
    parser = argparse.ArgumentParser(prog="python -m agents_adapter.agents", description=__doc__.splitlines()[0])
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

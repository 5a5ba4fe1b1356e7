"""The reasoning-gym example's warm-up: demonstrations in exactly the form openai-agents sends its calls.

The SDK's Chat Completions model sends the agent's instructions as the system message, the task's question
as the user message, an assistant message with `content: None` and the tool call, the tool's result, and
the tool schema it derives from the function tool (`strict`, `additionalProperties: false`, `title`s). The
demonstrations are those messages and that schema (taken from the SDK's own converter), so the supervised
warm-up teaches the prompt the proxy will render during RL, token for token.

As in the calculator example (examples/calculator/warmup.py), `direct_fraction` of the demonstrations
answer at once without the tool: the small model cannot do the arithmetic itself, so RL has to learn that
calling the calculator pays. A tool demonstration calls it with the entry's `metadata["expression"]`
(basic_arithmetic and the other arithmetic sets have one); a dataset without it takes `direct_fraction: 1`.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agents.models.chatcmpl_converter import Converter

from examples.calculator.tool import CALCULATOR, evaluate, format_number
from examples.reasoning_gym.agent import INSTRUCTIONS, calculator
from examples.reasoning_gym.tasks import DEFAULT_DATASET, GymTask, make_tasks

Conversation = list[dict[str, Any]]
WARMUP_SEED_OFFSET = 1000  # the warm-up's entries come from another seed than the run's tasks


def sdk_tools() -> list[dict[str, Any]]:
    """The `tools` of the SDK's Chat Completions request, from its own converter."""
    return [dict(Converter.tool_to_openai(calculator))]


def _opening(task: GymTask) -> Conversation:
    return [{"content": INSTRUCTIONS, "role": "system"}, {"role": "user", "content": task.question}]


def tool_conversation(task: GymTask) -> Conversation:
    """Call the calculator with the entry's expression, then answer what it returned."""
    expression = task.metadata.get("expression")
    if not isinstance(expression, str):
        raise ValueError(f"{task.dataset} entry {task.task_id} has no metadata['expression'] to demonstrate a "
                         "calculator call with: give warmup_options direct_fraction: 1")
    result = format_number(evaluate(expression))
    call = {"id": "call_0", "type": "function",
            "function": {"name": CALCULATOR, "arguments": json.dumps({"expression": expression})}}
    return [*_opening(task), {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": result},
            {"role": "assistant", "content": result}]


def direct_conversation(task: GymTask) -> Conversation:
    return [*_opening(task), {"role": "assistant", "content": task.answer}]


def demonstrations(count: int, seed: int, dataset: str = DEFAULT_DATASET, direct_fraction: float = 0.5,
                   **dataset_options: Any) -> list[dict[str, Any]]:
    """`count` demonstration records (`messages`, `tools`), from the dataset's own generator."""
    if not 0.0 <= direct_fraction <= 1.0:
        raise ValueError(f"direct_fraction must be in [0, 1], got {direct_fraction}")
    rng = random.Random(seed)
    tools = sdk_tools()
    return [{"messages": direct_conversation(t) if rng.random() < direct_fraction else tool_conversation(t),
             "tools": tools}
            for t in make_tasks(count, WARMUP_SEED_OFFSET + seed, dataset, **dataset_options)]

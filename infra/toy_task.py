"""The demo's toy task: arithmetic solved with the calculator tool, and the conversations the
supervised warm-up shows the model before RL.

The warm-up mixes two demonstrations of every kind of problem: the tool-using one (call the calculator
with the expression, then answer its result) and a direct one (the answer written at once, as a
teacher doing mental arithmetic would). A 0.8M-parameter model can copy an expression but cannot do
the arithmetic in its head, so after the warm-up it starts about half its episodes with a direct
answer that is usually wrong. What RL has to discover is the agentic behaviour: calling the tool is
what pays. The demo's reward curve (and the tool-use rate beside it) shows it being learned.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from agents_adapter.agents import CALCULATOR, SYSTEM_PROMPT, ArithmeticTask

Conversation = list[dict[str, Any]]


def expression_of(task: ArithmeticTask) -> str:
    return task.question.removeprefix("What is ").removesuffix("?")


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def tool_conversation(task: ArithmeticTask) -> Conversation:
    """Call the calculator with the task's expression, then answer exactly what it returned."""
    arguments = json.dumps({"expression": expression_of(task)})
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.question},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": CALCULATOR, "arguments": arguments}}
        ]},
        {"role": "tool", "tool_call_id": "call_0", "content": format_number(task.answer)},
        {"role": "assistant", "content": format_number(task.answer)},
    ]


def direct_conversation(task: ArithmeticTask) -> Conversation:
    """Answer at once, without the tool."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.question},
        {"role": "assistant", "content": format_number(task.answer)},
    ]


def warmup_conversations(tasks: Sequence[ArithmeticTask], direct_fraction: float, seed: int) -> list[Conversation]:
    """One demonstration per task: direct with probability `direct_fraction`, else tool-using."""
    if not 0.0 <= direct_fraction <= 1.0:
        raise ValueError(f"direct_fraction must be in [0, 1], got {direct_fraction}")
    rng = random.Random(seed)
    return [direct_conversation(t) if rng.random() < direct_fraction else tool_conversation(t) for t in tasks]

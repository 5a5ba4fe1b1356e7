"""The demo's toy task: arithmetic solved with the calculator tool, and the ideal conversation the
supervised warm-up shows the model (call the tool with the expression, then answer its result)."""

from __future__ import annotations

import json
from typing import Any

from agents_adapter.agents import CALCULATOR, SYSTEM_PROMPT, ArithmeticTask


def expression_of(task: ArithmeticTask) -> str:
    return task.question.removeprefix("What is ").removesuffix("?")


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def ideal_conversation(task: ArithmeticTask) -> list[dict[str, Any]]:
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

"""The calculator example's warm-up: the conversations the supervised warm-up shows the model before RL.

The warm-up mixes two demonstrations of every kind of problem: the tool-using one (call the calculator
with the expression, then answer its result) and a direct one (the answer written at once, as a
teacher doing mental arithmetic would). A 0.8M-parameter model can copy an expression but cannot do
the arithmetic in its head, so after the warm-up it starts about half its episodes with a direct
answer that is usually wrong. What RL has to discover is the agentic behaviour: calling the tool is
what pays. The demo's reward curve (and the tool-use rate beside it) shows it being learned.

`demonstrations` is what a run config names as its warm-up (`model.warmup`);
`python -m examples.calculator.warmup --out demos.jsonl` writes the same records as a file for
`python -m trainer_svc.warmup --demonstrations demos.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.calculator.agent import SYSTEM_PROMPT
from examples.calculator.tasks import ArithmeticTask, expression_of, make_arithmetic_tasks
from examples.calculator.tool import CALCULATOR, CALCULATOR_TOOL, format_number

Conversation = list[dict[str, Any]]
WARMUP_SEED_OFFSET = 1000  # the warm-up's problems are drawn apart from the run's tasks (same seed, other stream)


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


def demonstrations(count: int, seed: int, max_operand: int = 9, direct_fraction: float = 0.5) -> list[dict[str, Any]]:
    """`count` demonstration records (`messages`, `tools`): the warm-up data of the demo's model."""
    tasks = make_arithmetic_tasks(count, seed=WARMUP_SEED_OFFSET + seed, max_operand=max_operand)
    return [{"messages": c, "tools": [CALCULATOR_TOOL]} for c in warmup_conversations(tasks, direct_fraction, seed)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.calculator.warmup", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON Lines file to write")
    parser.add_argument("--count", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--direct-fraction", type=float, default=0.5,
                        help="share of demonstrations that answer without the tool")
    args = parser.parse_args(argv)
    records = demonstrations(args.count, args.seed, args.max_operand, args.direct_fraction)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()

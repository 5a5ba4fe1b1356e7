"""The calculator example's verifier: is the last number of the final answer the task's answer?

Taking the last number (not the whole reply) lets a model that explains itself still be right; a
reply without a number is wrong, never an error.
"""

from __future__ import annotations

import re
from typing import Final

from examples.calculator.tasks import ArithmeticTask

_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?")


def verify(answer: str, task: ArithmeticTask) -> float:
    """1.0 when the last number in the answer equals the task's answer."""
    numbers = _NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    return 1.0 if abs(float(numbers[-1]) - task.answer) < 1e-6 else 0.0

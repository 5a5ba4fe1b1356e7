"""The demo's shaped reward: format, faithful report of the tool's result, correctness."""

from __future__ import annotations

import pytest

from examples.calculator.agent import EpisodeResult
from examples.calculator.reward import shaped_reward
from examples.calculator.tasks import ArithmeticTask

pytestmark = pytest.mark.unit
TASK = ArithmeticTask("t", "What is 3 + 4?", 7.0)


@pytest.mark.parametrize(
    ("answer", "tool_calls", "tool_errors", "tool_output", "expected"),
    [
        ("7", 1, 0, "7", 1.0),  # tool used, its result reported, right answer
        ("9", 1, 0, "9", 0.5),  # wrong expression, result reported faithfully
        ("5", 1, 0, "9", 0.2),  # tool used, answer made up
        ("7", 0, 0, "", 0.5),  # right answer without the tool
        ("7", 1, 1, "", 0.5),  # a broken tool call earns no format reward
        ("", 0, 0, "", 0.0),
    ],
)
def test_shaped_reward(answer: str, tool_calls: int, tool_errors: int, tool_output: str, expected: float) -> None:
    result = EpisodeResult("s", "t", answer=answer, tool_calls=tool_calls, tool_errors=tool_errors,
                           answered=True, last_tool_output=tool_output)
    assert shaped_reward(result, TASK) == pytest.approx(expected)

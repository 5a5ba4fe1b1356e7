"""The calculator example's reward, as the rollout workers report it: R1-style shaping for a tool agent.

Correct answers are rare at the start of a run from a small model, so the reward also pays for calling
the calculator correctly and for reporting what it returned: GRPO then has reward variance to learn
from before correctness does.
"""

from __future__ import annotations

from examples.calculator.agent import EpisodeResult
from examples.calculator.tasks import ArithmeticTask
from examples.calculator.verifier import verify

FORMAT_REWARD = 0.2  # the episode used the calculator correctly (a tool call that parsed and ran)
REPORT_REWARD = 0.3  # the final answer reports what the calculator returned
CORRECT_REWARD = 0.5  # the final answer is the task's answer


def shaped_reward(result: EpisodeResult, task: ArithmeticTask) -> float:
    """Format, faithful report, correctness — R1-style shaping for a tool agent: the small rewards for
    calling the tool and reporting its result give GRPO a signal before correct answers are common."""
    used_tool = result.tool_calls > 0 and result.tool_errors == 0
    reported = used_tool and result.answered and result.last_tool_output != "" and verify(
        result.answer, ArithmeticTask(task.task_id, "", _number(result.last_tool_output))) == 1.0
    correct = verify(result.answer, task)
    return FORMAT_REWARD * used_tool + REPORT_REWARD * reported + CORRECT_REWARD * correct


def correct(result: EpisodeResult, task: ArithmeticTask) -> float:
    """A held-out task's score (the evaluation's accuracy): the final answer is right, whatever the route."""
    return verify(result.answer, task)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")

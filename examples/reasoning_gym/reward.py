"""The reasoning-gym example's reward and score: reasoning-gym's own `score_answer`, plus the calculator
example's format shaping.

`shaped_reward` = 0.2 when the calculator was called and every call ran + 0.3 when the final answer is what
the calculator returned last + 0.5 x `score_answer(answer, entry)` (the calculator example's weights,
examples/calculator/reward.py: a small model's right answers are rare at first, and the shaping gives GRPO
reward variance before they are common). `score` is `score_answer` alone: the held-out accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import reasoning_gym

from examples.calculator.agent import EpisodeResult
from examples.calculator.reward import CORRECT_REWARD, FORMAT_REWARD, REPORT_REWARD
from examples.reasoning_gym.tasks import GymTask


@cache
def _score_answer(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    return reasoning_gym.get_score_answer_fn(dataset)


def score(episode: EpisodeResult, task: GymTask) -> float:
    """reasoning-gym's verdict on the final answer, in [0, 1] (0 for an unanswered episode)."""
    if not episode.answered:
        return 0.0
    return float(_score_answer(task.dataset)(episode.answer, task.entry()))


def shaped_reward(episode: EpisodeResult, task: GymTask) -> float:
    used_tool = episode.tool_calls > 0 and episode.tool_errors == 0
    reported = used_tool and episode.answered and episode.answer.strip() == episode.last_tool_output
    return FORMAT_REWARD * used_tool + REPORT_REWARD * reported + CORRECT_REWARD * score(episode, task)

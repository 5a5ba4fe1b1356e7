"""The collapse guard: a plain function of the recent steps' metrics that says when a run is collapsing.

The collapse of issue 15 (seq_mean_token_mean without overlong handling) shows in the step metrics
long before the reward says anything useful: a long wrong answer is penalised less per token than a
short one, so the mean response length climbs to the agent's max_tokens, the share of truncated
sessions goes to 1, every member of a group gets the same (failing) reward and the share of
zero-variance groups goes to 1: no GRPO gradient is left to recover with. Entropy tells the other two
ways a policy dies: it collapses (the policy turned greedy, exploration stopped) or explodes (the
policy turned to noise). Each signal must hold on each of the last `window` completed steps, so one
bad step is not a collapse; the thresholds are `CollapseGuardConfig`'s. The service logs a warning
and puts the signals in `TrainStepCompleted.collapse_signals`; training goes on (the guard reports,
the user decides). A policy that solves its tasks is also greedy and its groups all agree; with
`converged_reward` set (the reward of a solved task) those two signals are not raised while the recent
steps reach it: convergence is where RL is meant to end, a collapse is getting stuck below it.

The history the guard needs is the first `window` steps (the baseline of the relative signals) and
the last `window` (`keep`): a few numbers, kept in the checkpoint so a restart does not forget them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from schemas.events import TrainStepCompleted
from trainer_svc.config import CollapseGuardConfig

LENGTH_RUNAWAY, ENTROPY_COLLAPSE, ENTROPY_EXPLOSION, ZERO_VARIANCE = (
    "length_runaway", "entropy_collapse", "entropy_explosion", "zero_variance")


@dataclass(frozen=True)
class StepMetrics:
    """The numbers of one completed step that the guard reads."""

    step: int
    entropy: float
    response_length_mean: float
    truncated_fraction: float
    zero_variance_fraction: float
    reward_mean: float = math.nan  # nan: a history checkpointed before the guard read rewards

    @classmethod
    def of(cls, event: TrainStepCompleted, filtered_rewards: Sequence[float] = ()) -> StepMetrics:
        """`filtered_rewards`: the rewards of the sessions dynamic sampling left out of the step."""
        trained = len(event.trajectory_ids)
        total = event.reward_mean * trained + sum(filtered_rewards)
        reward = total / (trained + len(filtered_rewards)) if trained + len(filtered_rewards) else event.reward_mean
        return cls(event.step, event.entropy, event.response_length_mean, event.truncated_fraction,
                   event.zero_variance_fraction, reward)

    def to_json(self) -> list[float]:
        return [self.step, self.entropy, self.response_length_mean, self.truncated_fraction,
                self.zero_variance_fraction, self.reward_mean]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> StepMetrics:
        step, entropy, length, truncated, zero, *reward = data
        return cls(int(step), float(entropy), float(length), float(truncated), float(zero),
                   float(reward[0]) if reward else math.nan)


def keep(history: Sequence[StepMetrics], window: int) -> list[StepMetrics]:
    """The part of the history `detect` reads: the first `window` steps and the last `window`."""
    if len(history) <= 2 * window:
        return list(history)
    return [*history[:window], *history[-window:]]


def observe(history: Sequence[StepMetrics], step: StepMetrics, config: CollapseGuardConfig,
            max_response_tokens: int | None = None) -> tuple[list[StepMetrics], tuple[str, ...]]:
    """The history kept after one more step, and the signals it shows (`detect`)."""
    kept = keep([*history, step], config.window)
    return kept, detect(kept, config, max_response_tokens)


def detect(history: Sequence[StepMetrics], config: CollapseGuardConfig,
           max_response_tokens: int | None = None) -> tuple[str, ...]:
    """The signals that hold on each of the last `window` steps of `history` (oldest first), each as
    'signal: detail'; () when the run looks healthy, the guard is off, or there are too few steps."""
    w = config.window
    if not config.enabled or len(history) < w:
        return ()
    recent = history[-w:]
    baseline = history[:w] if len(history) >= 2 * w else None
    collapse, explosion = _entropy(recent, baseline, config)
    zero = min(m.zero_variance_fraction for m in recent)
    stuck = (f"{ZERO_VARIANCE}: {zero:.0%}+ of the groups had one reward for {w} steps (no gradient left)"
             if zero >= config.max_zero_variance_fraction else "")
    if converged(recent, config):  # greedy and unanimous because it solves its tasks: not a collapse
        collapse = stuck = ""
    return tuple(s for s in (_length(recent, baseline, config, max_response_tokens), collapse, explosion, stuck) if s)


def converged(recent: Sequence[StepMetrics], config: CollapseGuardConfig) -> bool:
    """The recent steps' mean reward reached `converged_reward`: low entropy and groups that all got one
    reward then mean the policy solves its tasks, which is where RL is meant to end up. (The window's
    mean: a single step of 16 sampled sessions is too noisy to tell.)"""
    target = config.converged_reward
    return target is not None and fmean(m.reward_mean for m in recent) >= target


def _length(recent: Sequence[StepMetrics], baseline: Sequence[StepMetrics] | None, config: CollapseGuardConfig,
            max_response_tokens: int | None) -> str:
    w, length = len(recent), min(m.response_length_mean for m in recent)
    truncated = min(m.truncated_fraction for m in recent)
    if truncated >= config.max_truncated_fraction:
        return (f"{LENGTH_RUNAWAY}: {truncated:.0%}+ of the sessions truncated at max_tokens for {w} steps "
                f"(mean response length {recent[-1].response_length_mean:.1f})")
    if max_response_tokens is not None and length >= config.max_length_fraction * max_response_tokens:
        return (f"{LENGTH_RUNAWAY}: mean response length {length:.1f}+ of max_tokens {max_response_tokens} "
                f"for {w} steps")
    start = fmean(m.response_length_mean for m in baseline) if baseline else 0.0
    if start > 0 and length >= config.max_length_growth * start:
        return f"{LENGTH_RUNAWAY}: mean response length {length:.1f}+ for {w} steps, {length / start:.1f}x the start"
    return ""


def _entropy(recent: Sequence[StepMetrics], baseline: Sequence[StepMetrics] | None,
             config: CollapseGuardConfig) -> tuple[str, str]:
    start = fmean(m.entropy for m in baseline) if baseline else 0.0
    if start <= 0:
        return "", ""
    low, high, w = max(m.entropy for m in recent), min(m.entropy for m in recent), len(recent)
    collapse = (f"{ENTROPY_COLLAPSE}: entropy {low:.3f} or less for {w} steps, {low / start:.0%} of the start "
                f"({start:.3f})") if low <= config.min_entropy_ratio * start else ""
    explosion = (f"{ENTROPY_EXPLOSION}: entropy {high:.3f} or more for {w} steps, {high / start:.1f}x the start "
                 f"({start:.3f})") if high >= config.max_entropy_ratio * start else ""
    return collapse, explosion

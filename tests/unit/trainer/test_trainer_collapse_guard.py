"""The collapse guard on synthetic runs: the length collapse of issue 15 (seq_mean_token_mean without
overlong handling) is detected from step metrics computed the way the trainer computes them, from
synthetic batches; a healthy run is never flagged; entropy collapse / explosion; the guard's history
survives a checkpoint."""

from __future__ import annotations

import math
import random

import pytest

from schemas.events import TrainStepCompleted, Trajectory
from tests.factories import example
from tests.unit.trainer.trainer_helpers import node, trajectory
from trainer_svc.collapse_guard import StepMetrics, detect, keep
from trainer_svc.config import AlgorithmConfig, CollapseGuardConfig, ServiceConfig
from trainer_svc.errors import ConfigError
from trainer_svc.ledger import Ledger
from trainer_svc.overlong import response_lengths
from trainer_svc.selection import select_trainable
from trainer_svc.trainer import pack_trajectory

pytestmark = pytest.mark.unit

MAX_TOKENS = 80
GUARD = CollapseGuardConfig()
#: the configuration that collapsed in issue 15: per-session mean loss, no overlong mask or penalty
COLLAPSING = AlgorithmConfig(aggregation="seq_mean_token_mean", max_response_tokens=MAX_TOKENS)


def session(tid: str, group: str, length: int, reward: float) -> Trajectory:
    """A one-call session: a 6-token prompt, then `length` generated tokens."""
    return trajectory([node(0, -1, [1] * 6 + [2] * length, [0] * 6 + [1] * length)], trajectory_id=tid,
                      group_id=group, reward=reward)


def batch_metrics(step: int, batch: list[Trajectory], entropy: float) -> StepMetrics:
    """A step's guard metrics computed by the trainer's own code: selection (zero-variance share) and
    the packed trees' call lengths (mean response length, truncated share)."""
    selection = select_trainable(batch, COLLAPSING)
    lengths = response_lengths([pack_trajectory(t) for t in selection.kept], COLLAPSING.max_response_tokens)
    return StepMetrics(step, entropy, lengths.mean_call_length, lengths.truncated_fraction,
                       selection.zero_variance_groups / selection.num_groups)


def synthetic_run(seed: int, *, collapsing: bool, steps: int = 30, groups: int = 4, size: int = 4) -> list[StepMetrics]:
    """Batches of `groups` x `size` sessions per step. Collapsing: the typical length climbs 3 tokens a
    step from 30 to max_tokens; a truncated answer is wrong (reward 0), so as truncation spreads every
    group gets one reward. Healthy: lengths stay around 30 and accuracy rises from 30 % to 70 %."""
    rng = random.Random(seed)
    out = []
    for k in range(steps):
        typical = 30 + 3 * k if collapsing else 30
        accuracy = 0.4 if collapsing else 0.3 + 0.4 * k / steps
        batch = []
        for g in range(groups):
            for i in range(size):
                length = max(1, min(MAX_TOKENS, typical + rng.randint(-8, 8)))
                correct = length < MAX_TOKENS and rng.random() < accuracy
                batch.append(session(f"s{k}-{g}-{i}", f"g{k}-{g}", length, 1.0 if correct else 0.0))
        entropy = 1.2 + rng.uniform(-0.1, 0.1) if collapsing else 1.2 - 0.4 * k / steps
        out.append(batch_metrics(k + 1, batch, entropy))
    return out


def guard_as_the_service_runs_it(run: list[StepMetrics]) -> list[tuple[str, ...]]:
    """The signals of each step, with the history trimmed after every step as the service keeps it."""
    history: list[StepMetrics] = []
    signals = []
    for metrics in run:
        history = keep([*history, metrics], GUARD.window)
        signals.append(detect(history, GUARD, MAX_TOKENS))
    return signals


def test_the_length_collapse_configuration_is_detected() -> None:
    run = synthetic_run(0, collapsing=True)
    assert run[0].response_length_mean < 40 and run[-1].response_length_mean == MAX_TOKENS
    assert run[-1].truncated_fraction == 1.0 and run[-1].zero_variance_fraction == 1.0
    signals = guard_as_the_service_runs_it(run)
    first = next(i for i, s in enumerate(signals) if s)
    assert 8 <= first < 20, f"fired at step {first + 1}"  # once truncation took hold, before the run is lost
    assert all(signals[first:])  # and every step after
    assert [s.split(":")[0] for s in signals[-1]] == ["length_runaway", "zero_variance"]
    assert signals[-1][0].startswith("length_runaway: 100%+ of the sessions truncated")


def test_a_healthy_run_is_never_flagged() -> None:
    for seed in range(3):
        run = synthetic_run(seed, collapsing=False)
        assert max(m.truncated_fraction for m in run) < 0.2
        assert guard_as_the_service_runs_it(run) == [()] * len(run)


def metrics(step: int, *, entropy: float = 1.0, length: float = 30.0, truncated: float = 0.0,
            zero: float = 0.25, reward: float = 0.5) -> StepMetrics:
    return StepMetrics(step, entropy, length, truncated, zero, reward)


def test_entropy_collapse_and_explosion_are_relative_to_the_first_steps() -> None:
    start = [metrics(i, entropy=2.0) for i in range(1, 4)]
    collapsed = [*start, *(metrics(i, entropy=0.3) for i in range(4, 7))]
    assert [s.split(":")[0] for s in detect(collapsed, GUARD)] == ["entropy_collapse"]
    exploded = [*start, *(metrics(i, entropy=7.0) for i in range(4, 7))]
    assert [s.split(":")[0] for s in detect(exploded, GUARD)] == ["entropy_explosion"]
    one_bad_step = [*start, metrics(4), metrics(5), metrics(6, entropy=0.1)]
    assert detect(one_bad_step, GUARD) == ()


def test_length_growth_without_a_known_limit_and_the_guard_switches() -> None:
    grown = [*(metrics(i, length=20.0) for i in range(1, 4)), *(metrics(i, length=65.0) for i in range(4, 7))]
    assert [s.split(":")[0] for s in detect(grown, GUARD)] == ["length_runaway"]
    assert detect(grown, GUARD.model_copy(update={"enabled": False})) == ()
    assert detect(grown[:2], GUARD) == ()  # fewer steps than the window
    stuck = [metrics(i, zero=1.0) for i in range(1, 4)]
    assert [s.split(":")[0] for s in detect(stuck, GUARD)] == ["zero_variance"]


def test_a_run_that_solves_its_tasks_is_converged_not_collapsed() -> None:
    """Entropy and group variance fall to nothing both when a run dies and when it solves every task;
    the rewards tell them apart once the guard knows what a solved task earns."""
    guard = GUARD.model_copy(update={"converged_reward": 0.9})
    start = [metrics(i, entropy=2.0, reward=0.4) for i in range(1, 4)]
    solved = [*start, *(metrics(i, entropy=0.1, zero=1.0, reward=0.97) for i in range(4, 7))]
    stuck = [*start, *(metrics(i, entropy=0.1, zero=1.0, reward=0.2) for i in range(4, 7))]
    assert [s.split(":")[0] for s in detect(solved, GUARD)] == ["entropy_collapse", "zero_variance"]
    assert detect(solved, guard) == ()
    assert [s.split(":")[0] for s in detect(stuck, guard)] == ["entropy_collapse", "zero_variance"]
    one_step_short = [*solved[:-1], metrics(6, entropy=0.1, zero=1.0, reward=0.5)]
    assert [s.split(":")[0] for s in detect(one_step_short, guard)] == ["entropy_collapse", "zero_variance"]
    runaway = [*start, *(metrics(i, length=78.0, truncated=0.9, reward=0.95) for i in range(4, 7))]
    assert [s.split(":")[0] for s in detect(runaway, guard, MAX_TOKENS)] == ["length_runaway"]


def test_the_history_is_trimmed_and_kept_in_the_checkpoint_state() -> None:
    history = [metrics(i) for i in range(1, 11)]
    assert [m.step for m in keep(history, 3)] == [1, 2, 3, 8, 9, 10]
    ledger = Ledger(0)
    ledger.step_metrics = keep(history, 3)
    assert Ledger.from_state(ledger.to_state(10), 0).step_metrics == ledger.step_metrics
    assert Ledger.from_state({"format": 1}, 0).step_metrics == []  # a checkpoint from before the guard
    old = StepMetrics.from_json([4, 1.0, 30.0, 0.0, 0.25])  # a history kept before the guard read rewards
    assert old.step == 4 and math.isnan(old.reward_mean)


def test_bad_guard_settings_name_the_field(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"collapse_guard\.window"):
        ServiceConfig.from_mapping({"run_id": "r", "base_model_dir": "x", "weights_root": "w",
                                    "collapse_guard": {"window": 0}})


def test_the_guard_reads_the_reward_of_every_session_the_step_saw() -> None:
    """Dynamic sampling trains only the groups that disagree: the trained batch's reward (here 0.5) stays
    low however well the policy does; the sessions it filtered (all right) count in the guard's reward."""
    event = example(TrainStepCompleted, step=7, reward_mean=0.5, trajectory_ids=("a", "b", "c", "d"))
    assert StepMetrics.of(event).reward_mean == 0.5
    assert StepMetrics.of(event, [1.0] * 12).reward_mean == pytest.approx((0.5 * 4 + 12) / 16)

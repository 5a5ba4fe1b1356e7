"""bench/demo_seeds.py's pure parts: every seed shares the base config's warm-up, and what counts as improved."""

from __future__ import annotations

import pytest

from infra.monitor import RunState
from infra.run_config import RunConfig
from infra.run_inputs import warmup_cache_key
from schemas import events as ev
from tests.unit.bench.bench_modules import load_bench
from tests.unit.infra.run_configs import DEMO

pytestmark = pytest.mark.unit


demo_seeds = load_bench("demo_seeds")


def test_seeds_vary_the_sampling_seed_and_share_the_base_warm_up() -> None:
    base = RunConfig.load(DEMO)
    configs = [demo_seeds.seed_config(base, seed) for seed in (3, 4)]
    assert [c.seed for c in configs] == [3, 4]
    assert [c.name for c in configs] == [f"{base.name}-seed3", f"{base.name}-seed4"]
    assert {warmup_cache_key(c) for c in configs} == {warmup_cache_key(base)}
    reseeded = RunConfig.model_validate({**base.model_dump(mode="json"), "seed": 3})
    assert warmup_cache_key(reseeded) != warmup_cache_key(base)  # without warmup_seed the warm-up follows seed


def _eval(step: int, accuracy: float) -> ev.EvalCompleted:
    return ev.EvalCompleted(run_id="r", eval_id=f"e{step}", step=step, trigger="every", num_tasks=32,
                            accuracy=accuracy, reward_mean=0.0, versions=(step,))


def _state(rewards: list[float], accuracies: dict[int, float], collapse: bool = False) -> RunState:
    state = RunState()
    state.session_rewards = {f"t{v}": (v, r) for v, r in enumerate(rewards)}  # one session per version
    state.evals = {step: _eval(step, a) for step, a in accuracies.items()}
    state.collapse = [(5, ("response length",))] if collapse else []
    return state


def test_a_seed_improves_when_accuracy_gains_enough_reward_rises_and_it_never_collapsed() -> None:
    rewards = [0.1] * 10 + [0.2] * 10 + [0.5] * 10
    result = demo_seeds.seed_result(0, "run", _state(rewards, {0: 0.25, 20: 0.3, 40: 0.40625}), 1.0)
    assert (result.accuracy_start, result.accuracy_end) == (0.25, 0.40625)
    assert (result.reward_first, result.reward_last) == pytest.approx((0.1, 0.5))
    assert result.improved(0.15)
    assert not result.improved(0.2)  # +15.6 points is not +20
    collapsed = demo_seeds.seed_result(0, "run", _state(rewards, {0: 0.25, 40: 0.9}, collapse=True), 1.0)
    assert not collapsed.improved(0.15)
    falling = demo_seeds.seed_result(0, "run", _state(rewards[::-1], {0: 0.25, 40: 0.9}), 1.0)
    assert not falling.improved(0.15)


def test_a_short_run_compares_halves_of_its_steps() -> None:
    result = demo_seeds.seed_result(0, "run", _state([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], {0: 0.0, 6: 0.5}), 1.0)
    assert (result.reward_first, result.reward_last) == pytest.approx((0.2, 0.5))

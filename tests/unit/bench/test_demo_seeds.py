"""bench/demo_seeds.py's pure parts: every seed shares the base config's warm-up, what counts as improved, and
the figures come from the run's own summary.json (issue 38: the bench's own accounting disagreed with it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.monitor import RunState
from infra.run_config import RunConfig
from infra.run_inputs import warmup_cache_key
from infra.summary import run_figures
from schemas import events as ev
from tests.factories import example
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
    state.rewards = [(step, 0.5) for step in range(1, len(rewards))]  # a step per version after the first
    state.session_rewards = {f"t{v}": (v, r) for v, r in enumerate(rewards)}  # one session per version
    state.evals = {step: _eval(step, a) for step, a in accuracies.items()}
    state.collapse = [(5, ("response length",))] if collapse else []
    return state


def _seed(tmp_path: Path, state: RunState, name: str = "run") -> Any:
    """The seed's result as the bench reads it: from the summary.json the run wrote."""
    root = tmp_path / name
    root.mkdir()
    (root / "summary.json").write_text(json.dumps(run_figures(state)))
    return demo_seeds.seed_result(0, root, 1.0)


def test_a_seed_improves_when_accuracy_gains_enough_reward_rises_and_it_never_collapsed(tmp_path: Path) -> None:
    rewards = [0.1] * 10 + [0.2] * 10 + [0.5] * 10
    result = _seed(tmp_path, _state(rewards, {0: 0.25, 20: 0.3, 40: 0.40625}))
    assert (result.accuracy_start, result.accuracy_end) == (0.25, 0.40625)
    assert (result.window, result.reward_first, result.reward_last) == (3, pytest.approx(0.1), pytest.approx(0.5))
    assert result.improved(0.15)
    assert not result.improved(0.2)  # +15.6 points is not +20
    collapsed = _seed(tmp_path, _state(rewards, {0: 0.25, 40: 0.9}, collapse=True), "collapsed")
    assert not collapsed.improved(0.15)
    falling = _seed(tmp_path, _state(rewards[::-1], {0: 0.25, 40: 0.9}), "falling")
    assert not falling.improved(0.15)


def test_a_short_run_compares_its_first_and_last_version() -> None:
    figures = run_figures(_state([0.1, 0.2, 0.3], {0: 0.0, 2: 0.5}))
    assert (figures["window"], figures["rollout_reward_first"], figures["rollout_reward_last"]) == (
        1, pytest.approx(0.1), pytest.approx(0.3))


def test_the_sessions_a_runs_stop_cut_off_do_not_count_as_the_last_versions_reward(tmp_path: Path) -> None:
    """Measured on the demo (seed 1): the stop at max_steps cut off every session of v40 and 8 of v39's 71;
    ended with reward 0, they made the last versions' reward 0.59 instead of 0.94, and a seed whose reward
    rose less than that drop counted as not improved. They end `aborted` (agents_adapter.sdk) and are left out,
    and the bench reads the figures the run's summary.json holds, so the two cannot disagree."""
    state = RunState()
    state.rewards = [(step, 0.5) for step in range(1, 41)]
    state.evals = {0: _eval(0, 0.78), 40: _eval(40, 0.97)}
    sessions = [(v, 0.6 if v < 20 else 0.75, "completed") for v in range(40) for _ in range(4)]
    sessions += [(39, 0.0, "aborted")] * 2 + [(40, 0.0, "aborted")] * 4  # cut off by the stop
    for i, (version, reward, status) in enumerate(sessions):
        state.apply(example(ev.Trajectory, i, trajectory_id=f"t{i}", group_id=f"g{i // 4}", min_version=version,
                            reward=reward, status=status))
    assert state.rollout_rewards()[-1] == (39, pytest.approx(0.75))  # no version of only cut-off sessions
    assert state.trajectories == len(sessions) and len(state.aborted_sessions) == 6
    result = _seed(tmp_path, state)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (result.reward_first, result.reward_last, result.aborted) == (
        summary["rollout_reward_first"], summary["rollout_reward_last"], summary["aborted_sessions"])
    assert (result.reward_first, result.reward_last) == (pytest.approx(0.6), pytest.approx(0.75))
    assert result.improved(0.15)

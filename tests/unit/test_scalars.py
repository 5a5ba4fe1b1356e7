"""The run's train metrics as TensorBoard event files, read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.scalars import ScalarWriter, step_scalars
from schemas import events as ev
from tests.factories import example

pytestmark = pytest.mark.unit


def _read(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(s.step, s.value) for s in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def test_steps_and_weight_loads_are_read_back_by_tensorboard(tmp_path: Path) -> None:
    steps = [example(ev.TrainStepCompleted, i, step=i, loss=1.0 / i, reward_mean=0.1 * i, duration_ms=1500.0 * i,
                     staleness_histogram=(3, 1), status="completed") for i in (1, 2, 3)]
    skipped = example(ev.TrainStepCompleted, 4, step=4, status="skipped")
    loaded = example(ev.WeightsLoaded, 0, resource_id="r0", version=2, pause_ms=42.0)
    evaluated = example(ev.EvalCompleted, 0, step=3, accuracy=0.375, reward_mean=0.5)
    writer = ScalarWriter(tmp_path / "tb", "run-x")
    for event in [*steps, steps[1], skipped, loaded, evaluated]:  # steps[1] again: a re-published step, written once
        writer.write(event)
    writer.close()

    scalars = _read(tmp_path / "tb")
    assert scalars["train/loss"] == [(1, pytest.approx(1.0)), (2, pytest.approx(0.5)), (3, pytest.approx(1 / 3))]
    assert scalars["train/reward_mean"] == [(i, pytest.approx(0.1 * i)) for i in (1, 2, 3)]
    assert scalars["train/step_seconds"] == [(i, pytest.approx(1.5 * i)) for i in (1, 2, 3)]
    assert scalars["train/stale_tokens_fraction"] == [(i, pytest.approx(0.25)) for i in (1, 2, 3)]
    assert scalars["rollout/weight_sync_pause_ms/r0"] == [(2, pytest.approx(42.0))]
    assert scalars["eval/accuracy"] == [(3, pytest.approx(0.375))]
    assert set(scalars) == {*step_scalars(steps[0]), "rollout/weight_sync_pause_ms/r0", "eval/accuracy", "eval/reward"}


def test_a_skipped_step_has_no_scalars() -> None:
    assert step_scalars(example(ev.TrainStepCompleted, 0, status="skipped")) == {}

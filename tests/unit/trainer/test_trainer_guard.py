"""The non-finite guard and the group rules of a step: what a step refuses (and that the weights do not
move when it does), which members and groups it trains on, and how that is reported."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from schemas.events import Trajectory
from tests.unit.trainer.trainer_helpers import node, random_batch, trainer_config, trajectory
from trainer_svc.config import AlgorithmConfig, ConfigError
from trainer_svc.errors import BatchError, CheckpointError, NonFiniteError
from trainer_svc.selection import select_trainable
from trainer_svc.trainer import Trainer

pytestmark = pytest.mark.unit


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _unchanged(before: dict[str, torch.Tensor], trainer: Trainer) -> bool:
    return all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300, -2e6])
def test_a_nan_or_huge_reward_skips_the_step_and_leaves_the_weights_unchanged(tiny_model_dir: Path, bad: float) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    batch = random_batch(seed=11)
    poisoned = [*batch[:-1], dataclasses.replace(batch[-1], reward=bad)]
    before = _weights(trainer)
    with pytest.raises(NonFiniteError, match=batch[-1].trajectory_id) as refused:
        trainer.train_step(poisoned, 0)
    assert not refused.value.weights_changed
    assert _unchanged(before, trainer) and (trainer.step, trainer.version) == (0, 0)
    # the refused step left nothing behind: the next good step trains from the same weights
    result = trainer.train_step(batch, 0)
    assert result.new_version == 1 and math.isfinite(result.loss) and not _unchanged(before, trainer)


def test_a_non_finite_behaviour_logprob_is_refused_before_any_backward(tiny_model_dir: Path) -> None:
    """An engine that emitted NaN logprobs: the importance weights and so the loss are NaN."""
    trainer = Trainer(trainer_config(tiny_model_dir))
    batch = random_batch(seed=12)
    first = batch[0]
    nodes = list(first.nodes)
    for i, n in enumerate(nodes):
        if any(n.loss_mask):
            nodes[i] = node(n.node_id, n.parent, list(n.token_ids), list(n.loss_mask), logprob=math.nan)
            break
    before = _weights(trainer)
    with pytest.raises(NonFiniteError, match="loss is not finite") as refused:
        trainer.train_step([dataclasses.replace(first, nodes=tuple(nodes)), *batch[1:]], 0)
    assert not refused.value.weights_changed and _unchanged(before, trainer)
    assert all(p.grad is None for p in trainer.model.parameters())  # discarded, not carried into the next step


def test_a_refusal_after_an_applied_update_says_the_weights_changed(tiny_model_dir: Path) -> None:
    """One micro-batch per update: the first update is applied before the NaN tree's update is refused."""
    trainer = Trainer(trainer_config(tiny_model_dir, micro_batch_tokens=1, gradient_accumulation_steps=1))
    batch = random_batch(seed=13)
    last = batch[-1]
    nodes = [node(n.node_id, n.parent, list(n.token_ids), list(n.loss_mask), logprob=math.nan) for n in last.nodes]
    with pytest.raises(NonFiniteError) as refused:
        trainer.train_step([*batch[:-1], dataclasses.replace(last, nodes=tuple(nodes))], 0)
    assert refused.value.weights_changed and (trainer.step, trainer.version) == (0, 0)


def test_non_finite_weights_are_never_checkpointed(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    with torch.no_grad():
        next(trainer.model.parameters()).view(-1)[0] = math.nan
    with pytest.raises(CheckpointError, match="not finite"):
        trainer.save_checkpoint(tmp_path / "v1")
    assert not (tmp_path / "v1").exists()


def _member(tid: str, group: str, reward: float, *, empty: bool = False, status: str = "completed") -> Trajectory:
    nodes = () if empty else (node(0, -1, [1, 2, 3], [0, 1, 1]),)
    return trajectory(nodes, trajectory_id=tid, group_id=group, reward=reward, status=status)


def test_selection_excludes_failed_members_and_drops_unusable_groups() -> None:
    batch = [
        _member("a0", "a", 1.0), _member("a1", "a", 0.0), _member("a2", "a", 5.0, empty=True),  # trains on 2
        _member("b0", "b", 1.0), _member("b1", "b", 0.0, empty=True),  # one usable member left
        _member("c0", "c", 1.0), _member("c1", "c", 1.0),  # zero variance
        _member("d0", "d", 0.0, empty=True), _member("d1", "d", 1.0, status="aborted"),  # nothing usable
        _member("e0", "e", math.nan, empty=True), _member("e1", "e", 0.0), _member("e2", "e", 2.0),  # NaN unused
    ]
    selection = select_trainable(batch, AlgorithmConfig(drop_zero_variance_groups=True))
    assert [t.trajectory_id for t in selection.kept] == ["a0", "a1", "e1", "e2"]
    reasons = dict(selection.dropped_groups)
    assert sorted(reasons) == ["b", "c", "d"]
    assert "fewer than min_group_members=2" in reasons["b"] and "zero reward variance" in reasons["c"]
    assert reasons["d"] == "no usable member"
    assert set(selection.skipped_ids) == {"a2", "b0", "b1", "c0", "c1", "d0", "d1", "e0"}


def test_selection_rules_are_configurable_and_ppo_ignores_groups() -> None:
    batch = [_member("c0", "c", 1.0), _member("c1", "c", 1.0), _member("s0", "solo", 3.0)]
    keep_flat = select_trainable(batch, AlgorithmConfig(drop_zero_variance_groups=False, min_group_members=1))
    assert [t.trajectory_id for t in keep_flat.kept] == ["c0", "c1", "s0"] and not keep_flat.dropped_groups
    ppo = select_trainable([*batch, _member("x", "x", 0.0, empty=True)], AlgorithmConfig(algorithm="ppo"))
    assert [t.trajectory_id for t in ppo.kept] == ["c0", "c1", "s0"]
    assert ppo.dropped_groups == (("x", "no usable member"),)
    with pytest.raises(NonFiniteError, match="'s0'=inf"):
        select_trainable([*batch[:2], _member("s0", "solo", math.inf)], AlgorithmConfig(algorithm="ppo"))


def test_a_step_reports_the_groups_it_left_out(tiny_model_dir: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir, algorithm=AlgorithmConfig(drop_zero_variance_groups=True)))
    batch = random_batch(seed=14)  # groups g0, g1 with distinct rewards
    flat = [dataclasses.replace(t, trajectory_id=f"flat{i}", group_id="flat", reward=1.0) for i, t in enumerate(batch)]
    failed = _member("failed", "g0", 0.0, empty=True)
    result = trainer.train_step([*batch, *flat[:2], failed], 0)
    assert result.trajectory_ids == tuple(t.trajectory_id for t in batch)
    assert [g for g, _ in result.dropped_groups] == ["flat"]
    event = result.to_event(run_id="r")
    assert event.status == "completed" and event.dropped_group_ids == ("flat",)
    assert "zero reward variance" in event.reason
    with pytest.raises(BatchError, match="zero reward variance"):
        trainer.train_step(flat[:2], 1)


@pytest.mark.parametrize(("field", "value"), [("max_abs_reward", 0.0), ("max_abs_reward", math.inf),
                                              ("min_group_members", 0), ("drop_zero_variance_groups", "yes")])
def test_guard_config_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"algorithm.{field}"):
        AlgorithmConfig(**{field: value})  # type: ignore[arg-type]

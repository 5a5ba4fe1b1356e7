"""Trainer.train_step: DeepSpeed steps on the CPU, normalisation, staleness, masking, PPO, events."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from schemas.events import TrainStepCompleted, decode_event, encode_event
from tests.unit.trainer.trainer_helpers import node, random_batch, trainer_config, trajectory
from trainer_svc.config import AlgorithmConfig
from trainer_svc.errors import BatchError
from trainer_svc.losses import decoupled_ppo_loss
from trainer_svc.trainer import Trainer
from trainer_svc.tree_pack import pack_batch, pack_tree, token_logprobs

pytestmark = pytest.mark.unit


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float() for k, v in trainer.model.state_dict().items()}


def _max_change(before: dict[str, torch.Tensor], trainer: Trainer) -> float:
    after = _weights(trainer)
    return max(float((after[k] - before[k]).abs().max()) for k in before)


@pytest.mark.parametrize(("zero_stage", "precision"), [(0, "fp32"), (1, "fp32"), (2, "fp32"), (1, "bf16")])
def test_train_step_through_deepspeed(tiny_model_dir: Path, zero_stage: int, precision: str) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir, zero_stage=zero_stage, precision=precision,
                                     micro_batch_tokens=24))
    batch = random_batch(seed=1)
    before = _weights(trainer)
    result = trainer.train_step(batch, policy_version=0)
    assert _max_change(before, trainer) > 0
    trees = [pack_tree(t.nodes) for t in batch]
    generated = sum(int(t.loss_mask.sum()) for t in trees)
    assert result.step == 1 and result.new_version == 1 and trainer.version == 1
    assert result.num_tokens == sum(t.num_tokens for t in trees)
    assert result.num_branch_tokens == sum(t.num_branch_tokens for t in trees) >= result.num_tokens
    assert result.num_trainable_tokens == generated and sum(result.staleness_histogram) == generated
    assert result.num_micro_batches > 1 and result.num_updates == 1
    assert result.grad_norm > 0 and result.reward_mean == pytest.approx(sum(t.reward for t in batch) / len(batch))
    assert result.trajectory_ids == tuple(t.trajectory_id for t in batch)
    second = trainer.train_step(batch, policy_version=1)
    assert second.step == 2 and second.staleness_histogram[1] == generated  # the data is now one version old


def test_result_does_not_depend_on_the_micro_batch_split(tiny_model_dir: Path) -> None:
    """Loss weights are computed over the whole update, so the update is the same for any split."""
    batch = random_batch(seed=2, num_trajectories=9)
    results, weights = [], []
    for budget in (16, 40, 4096):
        for aggregation in ("token_mean", "seq_mean_token_mean"):
            config = trainer_config(tiny_model_dir, micro_batch_tokens=budget,
                                    algorithm=AlgorithmConfig(aggregation=aggregation))
            trainer = Trainer(config)
            results.append((aggregation, trainer.train_step(batch, 0)))
            weights.append((aggregation, _weights(trainer)))
    assert len({r.num_micro_batches for _, r in results}) == 3
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        losses = [r.loss for a, r in results if a == aggregation]
        assert max(losses) - min(losses) < 1e-6
        norms = [r.grad_norm for a, r in results if a == aggregation]
        assert max(norms) - min(norms) < 1e-5 * max(norms)
        # Adam's first step is about lr * sign(g): summation-order rounding in tiny gradients shows up
        # as a few 1e-6 in the weights (lr 1e-3), so the weights are compared at 2e-5.
        states = [w for a, w in weights if a == aggregation]
        for state in states[1:]:
            assert all(torch.allclose(state[k], states[0][k], atol=2e-5) for k in state)


def test_gradient_accumulation_steps_splits_updates(tiny_model_dir: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir, micro_batch_tokens=16, gradient_accumulation_steps=1))
    result = trainer.train_step(random_batch(seed=3), 0)
    assert result.num_updates == result.num_micro_batches > 1
    epochs = Trainer(trainer_config(tiny_model_dir, algorithm=AlgorithmConfig(ppo_epochs=2)))
    result = epochs.train_step(random_batch(seed=3), 0)
    assert result.num_updates == 2 and result.num_micro_batches == 1
    assert result.clip_fraction >= 0 and result.kl_behaviour > 0


def test_stale_data_is_not_learned_from(tiny_model_dir: Path) -> None:
    config = trainer_config(tiny_model_dir, algorithm=AlgorithmConfig(max_staleness=2))
    trainer = Trainer(config, initial_version=10)
    stale = random_batch(seed=4, version=7)  # staleness 3 > 2: every generated token is masked
    before = _weights(trainer)
    result = trainer.train_step(stale, 10)
    generated = sum(int(pack_tree(t.nodes).loss_mask.sum()) for t in stale)
    assert result.stale_tokens == generated and result.num_trainable_tokens == 0
    assert result.staleness_histogram == (0, 0, 0, generated)
    assert _max_change(before, trainer) == 0.0
    fresh = random_batch(seed=4, version=9)
    assert trainer.train_step(fresh, 11).stale_tokens == 0  # staleness 2: within the bound


def test_gradients_flow_only_through_generated_tokens(tiny_model_dir: Path) -> None:
    """The logits row a token's logprob is read from gets gradient only if that token was generated."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tree = pack_tree([node(0, -1, [10, 11, 12], [0, 0, 0]), node(1, 0, [13, 14], [1, 1]),
                      node(2, 0, [15, 16, 17], [1, 0, 1])])
    batch = pack_batch([tree])
    logits = model(input_ids=batch.token_ids[None], attention_mask=batch.attention_mask(torch.float32),
                   position_ids=batch.position_ids[None]).logits
    logits.retain_grad()
    logprobs = token_logprobs(logits[0], batch.token_ids, batch.predecessor)
    advantages = torch.ones(batch.num_tokens)
    loss, _ = decoupled_ppo_loss(logprobs, logprobs.detach(), batch.behaviour_logprobs, advantages,
                                 batch.loss_mask.float(), batch.loss_mask)
    loss.backward()
    assert logits.grad is not None
    row_has_grad = (logits.grad[0].abs().sum(-1) > 0).tolist()
    # rows read by generated tokens: 2 (-> 13, and -> 15), 3 (-> 14), 6 (-> 17); token 16 is given
    assert row_has_grad == [False, False, True, True, False, False, True, False]
    assert sum(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters()) > 0


def test_version_and_status_checks(tiny_model_dir: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    batch = random_batch(seed=5)
    with pytest.raises(BatchError, match="policy_version=3"):
        trainer.train_step(batch, 3)
    aborted = [dataclasses.replace(t, status="aborted") for t in batch]
    with pytest.raises(BatchError, match="all skipped"):
        trainer.train_step(aborted, 0)
    result = trainer.train_step([*batch[:3], *aborted[3:]], 0)
    assert result.skipped_trajectory_ids == tuple(t.trajectory_id for t in batch[3:])
    empty = trajectory([], trajectory_id="empty", group_id="g0", reward=0.0)
    assert trainer.train_step([*batch, empty], 1).skipped_trajectory_ids == ("empty",)
    broken = trajectory([node(0, 1, [1], [0])], trajectory_id="bad", group_id="g", reward=0.0)
    with pytest.raises(BatchError, match="'bad'"):
        trainer.train_step([broken], 2)


def test_kl_to_reference_starts_at_zero(tiny_model_dir: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir, algorithm=AlgorithmConfig(kl_coef=0.5, max_staleness=None)))
    batch = random_batch(seed=6)
    first = trainer.train_step(batch, 0)
    second = trainer.train_step(batch, 1)
    assert first.kl == pytest.approx(0.0, abs=1e-7) and second.kl > 0 and second.kl_loss > 0


def test_ppo_with_critic_learns_values(tiny_model_dir: Path) -> None:
    algorithm = AlgorithmConfig(algorithm="ppo", max_staleness=None, critic_learning_rate=1e-2, gamma=1.0, lam=0.95)
    trainer = Trainer(trainer_config(tiny_model_dir, micro_batch_tokens=32, algorithm=algorithm))
    batch = random_batch(seed=7)
    value_losses = [trainer.train_step(batch, v).value_loss for v in range(6)]
    assert value_losses[-1] < 0.5 * value_losses[0]
    assert trainer.critic is not None and trainer.critic.updates == 6


def test_step_result_becomes_a_train_step_completed_event(tiny_model_dir: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    result = trainer.train_step(random_batch(seed=8), 0)
    event = result.to_event(run_id="run-1", producer="trainer-0")
    decoded = decode_event(encode_event(event))
    assert isinstance(decoded, TrainStepCompleted)
    assert decoded.new_version == 1 and decoded.staleness_histogram == result.staleness_histogram
    assert decoded.num_tokens == result.num_tokens and decoded.run_id == "run-1"

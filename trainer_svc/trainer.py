"""The trainer's functional core: trajectories in, one policy update out; checkpoints; resume.

No Kafka here: the service shell consumes `Trajectory` events, calls `Trainer.train_step`, publishes the
`TrainStepCompleted` of `StepResult.to_event`, saves with `save_checkpoint` (passing the offsets it
consumed) and publishes `WeightsPublished` with the returned uri and digest.

One train step (policy version v -> v + 1):
  1. which trajectories and groups it trains on (`selection.select_trainable`); nothing left: `BatchError`
     (no weight changed; the shell reports the step as skipped);
  2. every session tree is packed into one sequence (`tree_pack`); trees go into micro-batches by tokens;
     generated tokens older than the staleness bound are masked (v - token_version > max_staleness);
  3. advantages: GRPO normalises session rewards within each group (group_id, else task_id, else the
     session alone); PPO runs GAE on every root-to-leaf branch over the critic's values and averages
     a shared token's advantage over the branches through it; overlong handling (`overlong`) first
     shapes the rewards (soft penalty) and/or takes truncated sessions out of the loss;
  4. before any weight changes: reference logprobs (k3 KL, when kl_coef > 0), critic values (PPO) and
     the proximal logprobs when the step makes more than one update; with a single update the
     proximal policy *is* the current one, so the training forward's detached logprobs are used;
  5. for each epoch and update: micro-batch forward, decoupled PPO loss, backward; one optimizer step.
Loss weights are computed per update over all its micro-batches (`micro_batches`), so the result does
not depend on how the trees were split into micro-batches. GRPO baselines come from the trajectories of
the step: the shell should hand over whole groups (`BatchReady`), or a group's baseline is partial.
Non-finite guard (`NonFiniteError`): a bad reward refuses the step before anything is computed (see
`selection`); so do non-finite advantages. A non-finite loss (checked before its backward) or gradient
(checked before the optimizer step) refuses the update and the step; the accumulated gradients are
discarded. Weights are checked after the last update: non-finite weights are never returned as a new
version. When an earlier update of the same step was already applied (several updates per step), the
error says `weights_changed=True` and the caller restores the last checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from schemas.events import Trajectory
from trainer_svc import checkpoint as ckpt
from trainer_svc.config import TrainerConfig
from trainer_svc.critic import ValueModel
from trainer_svc.engine import TrainEngine
from trainer_svc.errors import BatchError, CheckpointError, EngineError, NonFiniteError, TreePackError
from trainer_svc.losses import LossStats, decoupled_ppo_loss, token_entropy
from trainer_svc.micro_batches import (
    MicroBatch,
    build_micro_batches,
    mask_samples,
    set_gae_advantages,
    set_grpo_advantages,
    split_updates,
    step_staleness,
    update_token_weights,
)
from trainer_svc.overlong import ResponseLengths, overlong_penalty, response_lengths
from trainer_svc.selection import Selection, describe_dropped, group_key, select_trainable, usable
from trainer_svc.step_result import StepResult
from trainer_svc.tree_pack import (
    PackedTree,
    forward_logits,
    forward_logprobs,
    forward_values,
    pack_tree,
    token_logprobs,
)
from trainer_svc.value_loss import ValueLossStats, value_loss

log = logging.getLogger(__name__)


class _PretrainedModel(Protocol):
    """The part of a transformers model a checkpoint needs."""

    def save_pretrained(self, save_directory: Path, *, safe_serialization: bool) -> Any: ...


@dataclass
class _StepInputs:
    """What a step trains on, packed (`Trainer._inputs`)."""

    selection: Selection
    trees: list[PackedTree]
    rewards: Tensor  # as reported by the sessions
    train_rewards: Tensor  # what the advantages are computed from (overlong penalty added)
    lengths: ResponseLengths
    micro_batches: list[MicroBatch]
    updates: list[list[MicroBatch]]


class Trainer:
    """Policy (and critic for PPO) under DeepSpeed, driven one `train_step` at a time."""

    def __init__(self, config: TrainerConfig, *, initial_version: int = 0) -> None:
        self.config = config
        self.step = 0
        self.version = initial_version
        self.consumed_offsets: dict[str, Any] = {}
        algo = config.algorithm
        self.policy = TrainEngine(self._load_policy(), config.engine)
        self.reference: nn.Module | None = None
        if algo.kl_coef > 0:
            self.reference = self._frozen_copy(self._load_policy())
        self.critic: TrainEngine | None = None
        if algo.algorithm == "ppo":
            value_model = ValueModel.from_pretrained(config.model_path, config.engine.attn_implementation)
            self.critic = TrainEngine(value_model, config.engine, learning_rate=algo.critic_learning_rate)

    # --- construction ---------------------------------------------------------------------------

    def _load_policy(self) -> nn.Module:
        from transformers import AutoModelForCausalLM

        try:
            model: nn.Module = AutoModelForCausalLM.from_pretrained(
                self.config.model_path, dtype=torch.float32,
                attn_implementation=self.config.engine.attn_implementation,
            )
        except (OSError, ValueError) as e:
            raise EngineError(f"model_path={self.config.model_path!r} cannot be loaded: {e}") from e
        return model

    def _frozen_copy(self, model: nn.Module) -> nn.Module:
        model = model.to(device=next(self.policy.module.parameters()).device, dtype=self.policy.dtype)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    @property
    def model(self) -> nn.Module:
        """The policy as a plain transformers model (for sampling in tests, or inspection)."""
        return self.policy.module

    # --- train step -----------------------------------------------------------------------------

    def train_step(self, trajectories: Sequence[Trajectory], policy_version: int) -> StepResult:
        """One update of the policy from version `policy_version` (the version this trainer holds) to +1."""
        started = time.perf_counter()
        if policy_version != self.version:
            raise BatchError(f"policy_version={policy_version}, but the trainer holds version {self.version}")
        algo = self.config.algorithm
        inputs = self._inputs(trajectories, policy_version)
        self._prepare(inputs, multiple_updates=len(inputs.updates) * algo.ppo_epochs > 1)
        if not all(bool(torch.isfinite(mb.advantages).all()) for mb in inputs.micro_batches):
            raise NonFiniteError("advantages are not finite; step refused")
        stats, value_stats, grad_norm = self._apply_updates(inputs.updates, len(inputs.trees))
        if not all(e.parameters_finite() for e in self._engines):
            raise NonFiniteError("weights are not finite after the update; step refused", weights_changed=True)
        self.step += 1
        self.version = policy_version + 1
        result = self._result(inputs, policy_version, stats, value_stats, grad_norm,
                              duration_ms=(time.perf_counter() - started) * 1000.0)
        log.info(
            "train step %d: version %d -> %d, loss %.4f, reward %.3f, %d tokens in %.0f ms",
            result.step, policy_version, result.new_version, result.loss, result.reward_mean, result.num_tokens,
            result.duration_ms,
            extra={"service": "trainer", "step": result.step, "version": result.new_version},
        )
        return result

    @property
    def _engines(self) -> list[TrainEngine]:
        return [self.policy] if self.critic is None else [self.policy, self.critic]

    def _inputs(self, trajectories: Sequence[Trajectory], policy_version: int) -> _StepInputs:
        """The trainable trajectories packed into trees and micro-batches; `BatchError` when none is left."""
        algo = self.config.algorithm
        packed = {t.trajectory_id: pack_trajectory(t) for t in trajectories if usable(t, algo)}
        selection = select_trainable(trajectories, algo)
        if not selection.kept:
            raise BatchError(f"no trajectory to train on ({len(trajectories)} given, all skipped: "
                             f"status in {algo.skip_statuses}, no tokens, or their group dropped: "
                             f"{describe_dropped(selection.dropped_groups)})")
        trees = [packed[t.trajectory_id] for t in selection.kept]
        rewards = torch.tensor([float(t.reward) for t in selection.kept], dtype=torch.float32)
        lengths = response_lengths(trees, algo.max_response_tokens)
        train_rewards = rewards
        if algo.overlong_buffer is not None and algo.max_response_tokens is not None:
            train_rewards = rewards + overlong_penalty(lengths.longest, algo.max_response_tokens,
                                                       algo.overlong_buffer, algo.overlong_penalty)
        micro_batches = build_micro_batches(trees, policy_version, self.config.engine.micro_batch_tokens,
                                            algo.max_staleness)
        if algo.overlong_mask:
            mask_samples(micro_batches, lengths.truncated)
        updates = split_updates(micro_batches, self.config.engine.gradient_accumulation_steps)
        return _StepInputs(selection, trees, rewards, train_rewards, lengths, micro_batches, updates)

    @torch.no_grad()
    def _prepare(self, inputs: _StepInputs, *, multiple_updates: bool) -> None:
        """Everything computed with the weights of version v, before the first update."""
        algo = self.config.algorithm
        micro_batches = inputs.micro_batches
        if self.reference is not None:
            for mb in micro_batches:
                mb.reference = forward_logprobs(self.reference, mb.batch)
        if multiple_updates:
            self.policy.module.eval()
            for mb in micro_batches:
                mb.proximal = forward_logprobs(self.policy.engine, mb.batch)
            self.policy.module.train()
        if self.critic is None:
            set_grpo_advantages(micro_batches, inputs.train_rewards,
                                [group_key(t) for t in inputs.selection.kept], normalize_std=algo.normalize_std)
            return
        for mb in micro_batches:
            mb.old_values = forward_values(self.critic.engine, mb.batch).cpu()
        set_gae_advantages(micro_batches, inputs.trees, inputs.train_rewards, gamma=algo.gamma, lam=algo.lam,
                           normalize=algo.normalize_advantages)

    def _apply_updates(self, updates: list[list[MicroBatch]], num_samples: int
                       ) -> tuple[LossStats, ValueLossStats, float]:
        """Every epoch's updates: micro-batch backwards, then one optimizer step per update (policy, then
        critic). Returns the summed statistics and the last policy gradient norm."""
        algo = self.config.algorithm
        stats, value_stats = LossStats(), ValueLossStats()
        grad_norm = float("nan")
        applied = 0
        for _ in range(algo.ppo_epochs):
            for update in updates:
                weights = update_token_weights(update, num_samples, algo.aggregation, algo.aggregation_constant)
                for mb, w in zip(update, weights, strict=True):
                    stats = stats.merge(self._policy_backward(mb, w, applied))
                self._refuse_non_finite_gradients(self.policy, "policy", applied)
                grad_norm = self.policy.step()
                if self.critic is not None:  # the policy of this update is applied already
                    for mb, w in zip(update, weights, strict=True):
                        value_stats = value_stats.merge(self._critic_backward(mb, w, applied + 1))
                    self._refuse_non_finite_gradients(self.critic, "critic", applied + 1)
                    self.critic.step()
                applied += 1
        return stats, value_stats, grad_norm

    def _result(self, inputs: _StepInputs, policy_version: int, stats: LossStats, value_stats: ValueLossStats,
                grad_norm: float, *, duration_ms: float) -> StepResult:
        algo = self.config.algorithm
        passes = algo.ppo_epochs
        histogram, stale = step_staleness(inputs.trees, policy_version, algo.max_staleness)
        return StepResult(
            step=self.step,
            policy_version=policy_version,
            new_version=self.version,
            loss=stats.loss / passes,
            policy_loss=stats.policy_loss / passes,
            kl_loss=stats.kl_loss / passes,
            value_loss=value_stats.loss / passes,
            reward_mean=float(inputs.rewards.mean()),
            kl=stats.kl_ref if self.reference is not None else stats.kl_behaviour,
            kl_behaviour=stats.kl_behaviour,
            clip_fraction=stats.clip_fraction,
            iw_mean=stats.iw_mean,
            iw_max=stats.iw_max,
            iw_capped_fraction=stats.iw_capped_fraction,
            clip_fraction_low=stats.clip_fraction_low,
            clip_fraction_high=stats.clip_fraction_high,
            entropy=stats.entropy,
            response_length_mean=inputs.lengths.mean_call_length,
            truncated_fraction=inputs.lengths.truncated_fraction,
            num_groups=inputs.selection.num_groups,
            zero_variance_groups=inputs.selection.zero_variance_groups,
            staleness_histogram=histogram,
            stale_tokens=stale,
            num_tokens=sum(t.num_tokens for t in inputs.trees),
            num_branch_tokens=sum(t.num_branch_tokens for t in inputs.trees),
            num_trainable_tokens=stats.tokens // passes,
            num_micro_batches=len(inputs.micro_batches),
            num_updates=len(inputs.updates) * passes,
            grad_norm=grad_norm,
            duration_ms=duration_ms,
            trajectory_ids=tuple(t.trajectory_id for t in inputs.selection.kept),
            skipped_trajectory_ids=inputs.selection.skipped_ids,
            dropped_groups=inputs.selection.dropped_groups,
        )

    @staticmethod
    def _refuse_non_finite_loss(engine: TrainEngine, loss: Tensor, what: str, applied: int) -> None:
        """Before the backward: a non-finite loss never reaches the gradients."""
        if not bool(torch.isfinite(loss.detach()).all()):
            engine.discard_gradients()
            raise NonFiniteError(f"{what} loss is not finite ({float(loss.detach())}); step refused",
                                 weights_changed=applied > 0)

    @staticmethod
    def _refuse_non_finite_gradients(engine: TrainEngine, what: str, applied: int) -> None:
        """Before the optimizer step: non-finite gradients are never applied."""
        if not engine.gradients_finite():
            engine.discard_gradients()
            raise NonFiniteError(f"{what} gradients are not finite; step refused", weights_changed=applied > 0)

    def _policy_backward(self, mb: MicroBatch, weights: Tensor, applied: int) -> LossStats:
        algo = self.config.algorithm
        logits = forward_logits(self.policy.engine, mb.batch)
        device = logits.device
        predecessor, train_mask = mb.batch.predecessor.to(device), mb.train_mask.to(device)
        logprobs = token_logprobs(logits, mb.batch.token_ids.to(device), predecessor)
        proximal = mb.proximal.to(device) if mb.proximal is not None else logprobs.detach()
        loss, stats = decoupled_ppo_loss(
            logprobs, proximal, mb.batch.behaviour_logprobs.to(device), mb.advantages.to(device),
            weights.to(device), train_mask,
            clip_eps=algo.clip_eps, clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip,
            iw_cap=algo.iw_cap, iw_mode=algo.iw_mode,
            ref_logprobs=None if mb.reference is None else mb.reference.to(device), kl_coef=algo.kl_coef,
            kl_estimator=algo.kl_estimator, ratio_level=algo.ratio_level, sample_index=mb.sample_index.to(device),
            entropy=token_entropy(logits if algo.entropy_coef > 0 else logits.detach(), predecessor, train_mask),
            entropy_coef=algo.entropy_coef,
        )
        self._refuse_non_finite_loss(self.policy, loss, "policy", applied)
        self.policy.backward(loss)
        return stats

    def _critic_backward(self, mb: MicroBatch, weights: Tensor, applied: int) -> ValueLossStats:
        assert self.critic is not None and mb.old_values is not None and mb.returns is not None
        values = forward_values(self.critic.engine, mb.batch)
        device = values.device
        loss, stats = value_loss(values, mb.old_values.to(device), mb.returns.to(device), weights.to(device),
                                 mb.train_mask.to(device), clip=self.config.algorithm.value_clip)
        self._refuse_non_finite_loss(self.critic, loss, "value", applied)
        self.critic.backward(loss)
        return stats

    # --- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(
        self, directory: str | Path, *, consumed_offsets: Mapping[str, Any] | None = None
    ) -> tuple[str, str]:
        """Writes the checkpoint (see `checkpoint`) and returns (file:// uri of the directory, weights sha256).

        `consumed_offsets` (default: `self.consumed_offsets`) is stored as given, opaque to the trainer:
        the shell passes the offsets of every trajectory trained so far, so they commit with the weights.
        """
        final = Path(directory).resolve()
        if not all(e.parameters_finite() for e in self._engines):
            raise CheckpointError(f"{final}: weights are not finite; nothing is written")
        offsets = ckpt.check_offsets(self.consumed_offsets if consumed_offsets is None else consumed_offsets)
        staging = ckpt.staging_dir(final)
        try:
            cast(_PretrainedModel, self.policy.module).save_pretrained(staging, safe_serialization=True)
            ckpt.copy_tokenizer_files(Path(self.config.model_path), staging)
            self.policy.save_state(staging / ckpt.ENGINE_STATE_DIR)
            if self.critic is not None:
                self.critic.save_state(staging / ckpt.CRITIC_STATE_DIR)
            digest = ckpt.weights_sha256(staging)
            ckpt.write_progress(staging, ckpt.TrainerProgress(
                step=self.step, version=self.version, consumed_offsets=offsets, weights_sha256=digest
            ))
            ckpt.commit(staging, final)
        except (EngineError, CheckpointError):
            ckpt.discard(staging)
            raise
        except OSError as e:
            ckpt.discard(staging)
            raise CheckpointError(f"cannot write checkpoint {final}: {e}") from e
        self.consumed_offsets = offsets
        return final.as_uri(), digest

    def load_checkpoint(self, directory: str | Path) -> ckpt.TrainerProgress:
        """Restores weights, optimizer state and progress (step, version, consumed_offsets)."""
        path = Path(directory)
        progress = ckpt.read_progress(path)
        digest = ckpt.weights_sha256(path)
        if progress.weights_sha256 and digest != progress.weights_sha256:
            raise CheckpointError(f"{path}: weights sha256 {digest} != recorded {progress.weights_sha256}")
        try:
            self.policy.load_state(path / ckpt.ENGINE_STATE_DIR)
            if self.critic is not None:
                self.critic.load_state(path / ckpt.CRITIC_STATE_DIR)
        except EngineError as e:
            raise CheckpointError(f"{path}: {e}") from e
        self.step, self.version = progress.step, progress.version
        self.consumed_offsets = dict(progress.consumed_offsets)
        return progress


def pack_trajectory(trajectory: Trajectory) -> PackedTree:
    """The trajectory's tree packed for training; a malformed tree raises `BatchError` naming it.

    The shell can call this when it consumes a trajectory, to dead-letter a malformed one at once
    instead of failing the train step it would have joined.
    """
    try:
        return pack_tree(trajectory.nodes)
    except TreePackError as e:
        raise BatchError(f"trajectory {trajectory.trajectory_id!r}: {e}") from e

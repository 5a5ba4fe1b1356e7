"""The trainer's functional core: trajectories in, one policy update out; checkpoints; resume.

No Kafka here: the service shell consumes `Trajectory` events, calls `Trainer.train_step`, publishes the
`TrainStepCompleted` of `StepResult.to_event`, saves with `save_checkpoint` (passing the offsets it
consumed) and publishes `WeightsPublished` with the returned uri and digest.

One train step (policy version v -> v + 1):
  1. every session tree is packed into one sequence (`tree_pack`); trees go into micro-batches by tokens;
  2. generated tokens older than the staleness bound are masked (v - token_version > max_staleness);
  3. advantages: GRPO normalises session rewards within each group (group_id, else task_id, else the
     session alone); PPO runs GAE on every root-to-leaf branch over the critic's values and averages
     a shared token's advantage over the branches through it;
  4. before any weight changes: reference logprobs (k3 KL, when kl_coef > 0), critic values (PPO) and
     the proximal logprobs when the step makes more than one update; with a single update the
     proximal policy *is* the current one, so the training forward's detached logprobs are used;
  5. for each epoch and update: micro-batch forward, decoupled PPO loss, backward; one optimizer step.
Loss weights are computed per update over all its micro-batches, so the result does not depend on
how the trees were split into micro-batches. GRPO baselines come from the trajectories of the step:
the shell should hand over whole groups (`BatchReady`), or a group's baseline is partial.
Which data a step trains on (`select_trainable`, a plain function):
  * a member with a skipped status (default: aborted) or without tokens (a failed session, an empty
    trajectory) is not trained on; it still counts for its group's completion (upstream), but it is
    not part of the group's GRPO baseline: the group trains on its remaining members;
  * GRPO: a group with fewer than `min_group_members` usable members, or (with
    `drop_zero_variance_groups`) whose usable members all have one reward, is dropped; dropped groups
    and why are reported (`StepResult.dropped_groups` -> TrainStepCompleted.dropped_group_ids / reason);
  * nothing left: `BatchError` (no weight changed; the shell reports the step as skipped).
Non-finite guard (`NonFiniteError`): a usable member's reward that is NaN, infinite or beyond
`max_abs_reward` refuses the whole step before anything is computed (refused, not clamped); so do
non-finite advantages. A non-finite loss (checked before its backward) or gradient (checked before the
optimizer step) refuses the update and the step; the accumulated gradients are discarded. Weights are
checked after the last update: non-finite weights are never returned as a new version. When an earlier
update of the same step was already applied (several updates per step), the error says
`weights_changed=True` and the caller restores the last checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from schemas.events import TrainStepCompleted, Trajectory
from trainer_svc import checkpoint as ckpt
from trainer_svc.config import AlgorithmConfig, TrainerConfig
from trainer_svc.critic import ValueModel
from trainer_svc.engine import TrainEngine
from trainer_svc.errors import BatchError, CheckpointError, EngineError, NonFiniteError, TreePackError
from trainer_svc.losses import (
    LossStats,
    ValueLossStats,
    aggregation_weights,
    decoupled_ppo_loss,
    fresh_mask,
    gae,
    grpo_advantages,
    merge_histograms,
    staleness_histogram,
    value_loss,
    whiten,
)
from trainer_svc.tree_pack import (
    PackedBatch,
    PackedTree,
    forward_logprobs,
    forward_values,
    pack_batch,
    pack_tree,
    plan_micro_batches,
)

log = logging.getLogger(__name__)


class _PretrainedModel(Protocol):
    """The part of a transformers model a checkpoint needs."""

    def save_pretrained(self, save_directory: Path, *, safe_serialization: bool) -> Any: ...


@dataclass(frozen=True)
class StepResult:
    """What one train step did. `kl` is the k3 KL to the reference when kl_coef > 0, otherwise the k3 KL
    between the updated-from policy and the behaviour policies (how off-policy the data was)."""

    step: int
    policy_version: int
    new_version: int
    loss: float
    policy_loss: float
    kl_loss: float
    value_loss: float
    reward_mean: float
    kl: float
    kl_behaviour: float
    clip_fraction: float
    iw_mean: float
    iw_max: float
    iw_capped_fraction: float
    staleness_histogram: tuple[int, ...]
    stale_tokens: int
    num_tokens: int
    num_branch_tokens: int
    num_trainable_tokens: int
    num_micro_batches: int
    num_updates: int
    grad_norm: float
    duration_ms: float
    trajectory_ids: tuple[str, ...]
    skipped_trajectory_ids: tuple[str, ...] = ()
    dropped_groups: tuple[tuple[str, str], ...] = ()  # (group key, why it was not trained on)

    def to_event(self, *, run_id: str, producer: str = "") -> TrainStepCompleted:
        return TrainStepCompleted(
            producer=producer,
            correlation_id=run_id,
            run_id=run_id,
            step=self.step,
            new_version=self.new_version,
            loss=self.loss,
            reward_mean=self.reward_mean,
            kl=self.kl,
            clip_fraction=self.clip_fraction,
            staleness_histogram=self.staleness_histogram,
            num_tokens=self.num_tokens,
            trajectory_ids=self.trajectory_ids,
            duration_ms=self.duration_ms,
            reason=describe_dropped(self.dropped_groups),
            dropped_group_ids=tuple(g for g, _ in self.dropped_groups),
        )


@dataclass
class _MicroBatch:
    """A packed micro-batch and the per-token tensors computed for it before the updates."""

    batch: PackedBatch
    tree_indices: list[int]
    sample_index: Tensor  # which kept trajectory each token belongs to
    train_mask: Tensor  # generated and fresh
    advantages: Tensor = field(default_factory=lambda: torch.zeros(0))
    proximal: Tensor | None = None
    reference: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None


def _group_key(trajectory: Trajectory) -> str:
    return trajectory.group_id or trajectory.task_id or trajectory.trajectory_id


def describe_dropped(dropped: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{group}: {why}" for group, why in dropped)


@dataclass(frozen=True)
class Selection:
    """What a step trains on: the kept trajectories (input order), the others, the dropped groups."""

    kept: tuple[Trajectory, ...]
    skipped_ids: tuple[str, ...]
    dropped_groups: tuple[tuple[str, str], ...]


def usable(trajectory: Trajectory, algo: AlgorithmConfig) -> bool:
    """A member that has tokens to train on and a status whose reward means something."""
    return trajectory.status not in algo.skip_statuses and bool(trajectory.nodes)


def check_rewards(trajectories: Sequence[Trajectory], max_abs_reward: float) -> None:
    """Raises `NonFiniteError` naming every reward that is NaN, infinite or beyond the bound."""
    bad = [t for t in trajectories if not math.isfinite(t.reward) or abs(t.reward) > max_abs_reward]
    if bad:
        named = ", ".join(f"{t.trajectory_id!r}={t.reward!r}" for t in bad[:5])
        raise NonFiniteError(f"{len(bad)} reward(s) not finite or beyond max_abs_reward={max_abs_reward:g}: "
                             f"{named}; step refused")


def select_trainable(trajectories: Sequence[Trajectory], algo: AlgorithmConfig) -> Selection:
    """The members and groups a step trains on (see the module docstring); raises `NonFiniteError`
    when a usable member's reward cannot be trained on."""
    members = [t for t in trajectories if usable(t, algo)]
    check_rewards(members, algo.max_abs_reward)
    dropped: dict[str, str] = {}
    for t in trajectories:
        if not usable(t, algo):
            dropped.setdefault(_group_key(t), "no usable member")
    if algo.algorithm == "grpo":
        by_group: dict[str, list[Trajectory]] = {}
        for t in members:
            by_group.setdefault(_group_key(t), []).append(t)
        for key, group in by_group.items():
            if len(group) < algo.min_group_members:
                dropped[key] = f"{len(group)} usable member(s), fewer than min_group_members={algo.min_group_members}"
            elif algo.drop_zero_variance_groups and len({t.reward for t in group}) == 1:
                dropped[key] = f"zero reward variance (every usable member has reward {group[0].reward!r})"
            else:
                dropped.pop(key, None)
    else:
        for t in members:
            dropped.pop(_group_key(t), None)
    kept = tuple(t for t in members if _group_key(t) not in dropped)
    kept_ids = {t.trajectory_id for t in kept}
    return Selection(
        kept=kept,
        skipped_ids=tuple(t.trajectory_id for t in trajectories if t.trajectory_id not in kept_ids),
        dropped_groups=tuple(sorted(dropped.items())),
    )


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
        packed = {t.trajectory_id: pack_trajectory(t) for t in trajectories if usable(t, algo)}
        selection = select_trainable(trajectories, algo)
        kept = list(selection.kept)
        if not kept:
            raise BatchError(f"no trajectory to train on ({len(trajectories)} given, all skipped: "
                             f"status in {algo.skip_statuses}, no tokens, or their group dropped: "
                             f"{describe_dropped(selection.dropped_groups)})")
        trees = [packed[t.trajectory_id] for t in kept]
        rewards = torch.tensor([float(t.reward) for t in kept], dtype=torch.float32)

        histogram: list[int] = []
        for tree in trees:
            histogram = merge_histograms(
                histogram, staleness_histogram(tree.loss_mask, tree.versions, policy_version, algo.max_staleness)
            )
        micro_batches = self._micro_batches(trees, policy_version)
        updates = self._split_updates(micro_batches)
        self._prepare(micro_batches, trees, rewards, kept, multiple_updates=len(updates) * algo.ppo_epochs > 1)
        if not all(bool(torch.isfinite(mb.advantages).all()) for mb in micro_batches):
            raise NonFiniteError("advantages are not finite; step refused")

        stats = LossStats()
        value_stats = ValueLossStats()
        grad_norm = float("nan")
        applied = 0
        for _ in range(algo.ppo_epochs):
            for update in updates:
                weights = self._token_weights(update, len(kept))
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
        engines = [self.policy] if self.critic is None else [self.policy, self.critic]
        if not all(e.parameters_finite() for e in engines):
            raise NonFiniteError("weights are not finite after the update; step refused", weights_changed=True)

        self.step += 1
        self.version = policy_version + 1
        passes = algo.ppo_epochs
        stale = sum(int((t.loss_mask & ~fresh_mask(t.loss_mask, t.versions, policy_version, algo.max_staleness))
                        .sum()) for t in trees)
        result = StepResult(
            step=self.step,
            policy_version=policy_version,
            new_version=self.version,
            loss=stats.loss / passes,
            policy_loss=stats.policy_loss / passes,
            kl_loss=stats.kl_loss / passes,
            value_loss=value_stats.loss / passes,
            reward_mean=float(rewards.mean()),
            kl=stats.kl_ref if self.reference is not None else stats.kl_behaviour,
            kl_behaviour=stats.kl_behaviour,
            clip_fraction=stats.clip_fraction,
            iw_mean=stats.iw_mean,
            iw_max=stats.iw_max,
            iw_capped_fraction=stats.iw_capped_fraction,
            staleness_histogram=tuple(histogram),
            stale_tokens=stale,
            num_tokens=sum(t.num_tokens for t in trees),
            num_branch_tokens=sum(t.num_branch_tokens for t in trees),
            num_trainable_tokens=stats.tokens // passes,
            num_micro_batches=len(micro_batches),
            num_updates=len(updates) * passes,
            grad_norm=grad_norm,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            trajectory_ids=tuple(t.trajectory_id for t in kept),
            skipped_trajectory_ids=selection.skipped_ids,
            dropped_groups=selection.dropped_groups,
        )
        log.info(
            "train step %d: version %d -> %d, loss %.4f, reward %.3f, %d tokens in %.0f ms",
            result.step, policy_version, result.new_version, result.loss, result.reward_mean, result.num_tokens,
            result.duration_ms,
            extra={"service": "trainer", "step": result.step, "version": result.new_version},
        )
        return result

    def _micro_batches(self, trees: list[PackedTree], policy_version: int) -> list[_MicroBatch]:
        max_staleness = self.config.algorithm.max_staleness
        plan = plan_micro_batches([t.num_tokens for t in trees], self.config.engine.micro_batch_tokens)
        result = []
        for indices in plan:
            batch = pack_batch([trees[i] for i in indices])
            sample_index = torch.cat(
                [torch.full((trees[i].num_tokens,), i, dtype=torch.int64) for i in indices]
            )
            train_mask = fresh_mask(batch.loss_mask, batch.versions, policy_version, max_staleness)
            if bool((train_mask & (batch.predecessor < 0)).any()):
                log.warning("a generated token opens a session: it has no context and is not trained")
                train_mask = train_mask & (batch.predecessor >= 0)
            result.append(_MicroBatch(batch=batch, tree_indices=indices, sample_index=sample_index,
                                      train_mask=train_mask))
        return result

    def _split_updates(self, micro_batches: list[_MicroBatch]) -> list[list[_MicroBatch]]:
        per_update = self.config.engine.gradient_accumulation_steps or len(micro_batches)
        return [micro_batches[i:i + per_update] for i in range(0, len(micro_batches), per_update)]

    @torch.no_grad()
    def _prepare(
        self, micro_batches: list[_MicroBatch], trees: list[PackedTree], rewards: Tensor,
        kept: list[Trajectory], *, multiple_updates: bool,
    ) -> None:
        """Everything computed with the weights of version v, before the first update."""
        algo = self.config.algorithm
        if self.reference is not None:
            for mb in micro_batches:
                mb.reference = forward_logprobs(self.reference, mb.batch)
        if multiple_updates:
            self.policy.module.eval()
            for mb in micro_batches:
                mb.proximal = forward_logprobs(self.policy.engine, mb.batch)
            self.policy.module.train()
        if self.critic is None:
            per_sample = grpo_advantages(rewards, [_group_key(t) for t in kept], normalize_std=algo.normalize_std)
            for mb in micro_batches:
                mb.advantages = per_sample[mb.sample_index]
            return
        for mb in micro_batches:
            mb.old_values = forward_values(self.critic.engine, mb.batch).cpu()
            advantages, returns = [], []
            for position, tree_index in enumerate(mb.tree_indices):
                span = mb.batch.tree_slice(position)
                adv, ret = tree_gae(trees[tree_index], mb.old_values[span], float(rewards[tree_index]),
                                    gamma=algo.gamma, lam=algo.lam)
                advantages.append(adv)
                returns.append(ret)
            mb.advantages, mb.returns = torch.cat(advantages), torch.cat(returns)
        if algo.normalize_advantages:
            everything = torch.cat([mb.advantages for mb in micro_batches])
            mask = torch.cat([mb.train_mask for mb in micro_batches])
            whitened = whiten(everything, mask)
            offset = 0
            for mb in micro_batches:
                mb.advantages = whitened[offset:offset + mb.batch.num_tokens]
                offset += mb.batch.num_tokens

    def _token_weights(self, update: list[_MicroBatch], num_samples: int) -> list[Tensor]:
        counts = torch.zeros(num_samples, dtype=torch.float64)
        for mb in update:
            counts.index_add_(0, mb.sample_index[mb.train_mask],
                              torch.ones(int(mb.train_mask.sum()), dtype=torch.float64))
        per_sample = aggregation_weights(counts, self.config.algorithm.aggregation)
        return [torch.where(mb.train_mask, per_sample[mb.sample_index], 0.0) for mb in update]

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

    def _policy_backward(self, mb: _MicroBatch, weights: Tensor, applied: int) -> LossStats:
        algo = self.config.algorithm
        logprobs = forward_logprobs(self.policy.engine, mb.batch)
        device = logprobs.device
        proximal = mb.proximal.to(device) if mb.proximal is not None else logprobs.detach()
        loss, stats = decoupled_ppo_loss(
            logprobs, proximal, mb.batch.behaviour_logprobs.to(device), mb.advantages.to(device),
            weights.to(device), mb.train_mask.to(device),
            clip_eps=algo.clip_eps, clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip,
            iw_cap=algo.iw_cap, iw_mode=algo.iw_mode,
            ref_logprobs=None if mb.reference is None else mb.reference.to(device), kl_coef=algo.kl_coef,
        )
        self._refuse_non_finite_loss(self.policy, loss, "policy", applied)
        self.policy.backward(loss)
        return stats

    def _critic_backward(self, mb: _MicroBatch, weights: Tensor, applied: int) -> ValueLossStats:
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
        engines = [self.policy] if self.critic is None else [self.policy, self.critic]
        if not all(e.parameters_finite() for e in engines):
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


def tree_gae(
    tree: PackedTree, values: Tensor, reward: float, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE on every root-to-leaf branch (the session reward on the branch's last generated token);
    a token shared by several branches gets the mean of its branch advantages and returns."""
    advantage_sum = torch.zeros(tree.num_tokens, dtype=torch.float32)
    return_sum = torch.zeros(tree.num_tokens, dtype=torch.float32)
    count = torch.zeros(tree.num_tokens, dtype=torch.float32)
    for indices in tree.branch_token_indices():
        action = tree.loss_mask[indices]
        if not bool(action.any()):
            continue
        rewards = torch.zeros(indices.numel(), dtype=torch.float32)
        rewards[int(action.nonzero()[-1])] = reward
        adv, ret = gae(rewards, values[indices], action, gamma=gamma, lam=lam)
        advantage_sum.index_add_(0, indices, adv)
        return_sum.index_add_(0, indices, ret)
        count.index_add_(0, indices, torch.ones(indices.numel()))
    count = count.clamp(min=1.0)
    return advantage_sum / count, return_sum / count

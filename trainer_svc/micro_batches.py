"""A train step's packed trees cut into micro-batches, with the per-token tensors each update needs.

Micro-batches are cut by tokens (`engine.micro_batch_tokens`), so their number changes from step to
step; the updates of a step take `gradient_accumulation_steps` of them each (all by default). Loss
weights are computed per update over all its micro-batches (`update_token_weights`), so the result
does not depend on how the trees were split. Plain torch, no model: the forward passes that fill
`proximal`, `reference` and `old_values` are the trainer's.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trainer_svc.advantages import grpo_advantages, tree_gae, whiten
from trainer_svc.config import Aggregation
from trainer_svc.losses import aggregation_weights, fresh_mask, merge_histograms, staleness_histogram
from trainer_svc.tree_pack import PackedBatch, PackedTree, pack_batch, plan_micro_batches

log = logging.getLogger(__name__)


@dataclass
class MicroBatch:
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


def build_micro_batches(trees: Sequence[PackedTree], policy_version: int, micro_batch_tokens: int,
                        max_staleness: int | None) -> list[MicroBatch]:
    """The trees in micro-batches of at most `micro_batch_tokens`; stale generated tokens are not trained."""
    plan = plan_micro_batches([t.num_tokens for t in trees], micro_batch_tokens)
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
        result.append(MicroBatch(batch=batch, tree_indices=indices, sample_index=sample_index,
                                 train_mask=train_mask))
    return result


def step_staleness(trees: Sequence[PackedTree], policy_version: int, max_staleness: int | None
                   ) -> tuple[tuple[int, ...], int]:
    """(generated tokens per staleness, how many of them are beyond the bound) over a step's trees."""
    histogram: list[int] = []
    for tree in trees:
        histogram = merge_histograms(
            histogram, staleness_histogram(tree.loss_mask, tree.versions, policy_version, max_staleness)
        )
    stale = sum(int((t.loss_mask & ~fresh_mask(t.loss_mask, t.versions, policy_version, max_staleness)).sum())
                for t in trees)
    return tuple(histogram), stale


def split_updates(micro_batches: list[MicroBatch], gradient_accumulation_steps: int) -> list[list[MicroBatch]]:
    """Consecutive micro-batches per optimizer update (all of them in one update when 0)."""
    per_update = gradient_accumulation_steps or len(micro_batches)
    return [micro_batches[i:i + per_update] for i in range(0, len(micro_batches), per_update)]


def mask_samples(micro_batches: Sequence[MicroBatch], drop: Tensor) -> None:
    """Takes the samples where `drop` (bool, per sample) is set out of the loss: their tokens are not
    trained and do not count in the aggregation (DAPO's overlong filtering); their advantages stay."""
    for mb in micro_batches:
        mb.train_mask = mb.train_mask & ~drop[mb.sample_index]


def update_token_weights(update: Sequence[MicroBatch], num_samples: int, aggregation: Aggregation,
                         constant: float | None = None) -> list[Tensor]:
    """Per-token loss weights of each micro-batch of one update, aggregated over the whole update
    (`constant`: seq_mean_token_sum_norm's normaliser)."""
    counts = torch.zeros(num_samples, dtype=torch.float64)
    for mb in update:
        counts.index_add_(0, mb.sample_index[mb.train_mask],
                          torch.ones(int(mb.train_mask.sum()), dtype=torch.float64))
    per_sample = aggregation_weights(counts, aggregation, constant)
    return [torch.where(mb.train_mask, per_sample[mb.sample_index], 0.0) for mb in update]


def set_grpo_advantages(micro_batches: Sequence[MicroBatch], rewards: Tensor, group_keys: Sequence[Hashable],
                        *, normalize_std: bool) -> None:
    """Each token gets its session's group-normalised reward."""
    per_sample = grpo_advantages(rewards, group_keys, normalize_std=normalize_std)
    for mb in micro_batches:
        mb.advantages = per_sample[mb.sample_index]


def set_gae_advantages(micro_batches: Sequence[MicroBatch], trees: Sequence[PackedTree], rewards: Tensor, *,
                       gamma: float, lam: float, normalize: bool) -> None:
    """GAE over the critic's `old_values` on every tree, whitened across the step when `normalize`."""
    for mb in micro_batches:
        assert mb.old_values is not None, "the critic's values first"
        advantages, returns = [], []
        for position, tree_index in enumerate(mb.tree_indices):
            span = mb.batch.tree_slice(position)
            adv, ret = tree_gae(trees[tree_index], mb.old_values[span], float(rewards[tree_index]),
                                gamma=gamma, lam=lam)
            advantages.append(adv)
            returns.append(ret)
        mb.advantages, mb.returns = torch.cat(advantages), torch.cat(returns)
    if normalize:
        everything = torch.cat([mb.advantages for mb in micro_batches])
        mask = torch.cat([mb.train_mask for mb in micro_batches])
        whitened = whiten(everything, mask)
        offset = 0
        for mb in micro_batches:
            mb.advantages = whitened[offset:offset + mb.batch.num_tokens]
            offset += mb.batch.num_tokens

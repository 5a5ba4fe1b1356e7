"""Advantages: GRPO's group-normalised rewards, and GAE over a critic's values on a session tree.

Plain torch, no model: the trainer computes them once per step, before the first update, with the
weights of the version it trains from.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from trainer_svc.tree_pack import PackedTree


def grpo_advantages(
    rewards: Tensor, group_ids: Sequence[Hashable], *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Per-sample GRPO advantage: reward minus its group's mean, divided by the group's std if asked.

    The std is the unbiased sample std (as in DeepSeekMath / verl). A group of one sample has no
    baseline: its advantage is 0, so a lone sample teaches nothing rather than its raw reward.
    A group whose rewards are all equal also gets 0 (nothing to prefer).
    """
    if rewards.dim() != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not match {len(group_ids)} group ids")
    rewards = rewards.to(torch.float64)
    advantages = torch.zeros_like(rewards)
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    for indices in members.values():
        if len(indices) < 2:
            continue
        idx = torch.tensor(indices)
        group_rewards = rewards[idx]
        centred = group_rewards - group_rewards.mean()
        std = group_rewards.std(unbiased=True)
        if normalize_std and std > 0:
            centred = centred / (std + eps)
        advantages[idx] = centred
    return advantages.to(torch.float32)


def gae(
    rewards: Tensor, values: Tensor, action_mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation along the last dimension, over action tokens only.

    `values[..., t]` is the critic's value of the state *before* token t is generated, `rewards` is
    0 except where the environment gave one (the session reward on the last generated token).
    Given tokens (prompt, tool output) are not time steps: the recursion jumps over them, so the
    next state of the last token of a turn is the first token the policy generates in the next turn.
    After the last action the episode ends (next value 0). Returns (advantages, returns), both zero
    where `action_mask` is 0.
    """
    mask = action_mask.to(torch.bool)
    rewards = rewards.to(torch.float32)
    values = values.to(torch.float32)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[..., 0])
    next_advantage = torch.zeros_like(values[..., 0])
    for t in range(values.shape[-1] - 1, -1, -1):
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        advantage = delta + gamma * lam * next_advantage
        is_action = mask[..., t]
        advantages[..., t] = torch.where(is_action, advantage, torch.zeros_like(advantage))
        next_value = torch.where(is_action, values[..., t], next_value)
        next_advantage = torch.where(is_action, advantage, next_advantage)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero-mean unit-variance over the masked entries (PPO advantage normalisation); 0 elsewhere."""
    m = mask.to(torch.bool)
    count = int(m.sum())
    if count == 0:
        return torch.zeros_like(values)
    selected = values[m]
    mean = selected.mean()
    var = selected.var(unbiased=False) if count > 1 else torch.zeros((), dtype=values.dtype)
    return torch.where(m, (values - mean) * torch.rsqrt(var + eps), torch.zeros_like(values))


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

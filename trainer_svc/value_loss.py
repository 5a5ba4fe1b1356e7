"""The PPO critic's loss on per-token tensors, weighted like the policy loss (`losses.token_weights`),
so summing it over the micro-batches of an update gives the update's aggregate."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ValueLossStats:
    """Sums over the tokens of one or more value-loss calls."""

    loss: float = 0.0
    tokens: int = 0
    clipped: int = 0
    squared_error_sum: float = 0.0

    def merge(self, other: ValueLossStats) -> ValueLossStats:
        return ValueLossStats(
            loss=self.loss + other.loss,
            tokens=self.tokens + other.tokens,
            clipped=self.clipped + other.clipped,
            squared_error_sum=self.squared_error_sum + other.squared_error_sum,
        )

    @property
    def clip_fraction(self) -> float:
        return self.clipped / self.tokens if self.tokens else 0.0

    @property
    def mse(self) -> float:
        return self.squared_error_sum / self.tokens if self.tokens else 0.0


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, token_weights: Tensor, loss_mask: Tensor, *,
    clip: float | None = 0.2,
) -> tuple[Tensor, ValueLossStats]:
    """PPO critic loss 0.5 * max((V - R)^2, (V_clipped - R)^2), V_clipped within `clip` of the old value."""
    mask = loss_mask.to(torch.bool)
    weights = torch.where(mask, token_weights, torch.zeros_like(token_weights))
    error = (values - returns) ** 2
    if clip is None:
        per_token = error
        clipped_count = 0
    else:
        old = old_values.detach()
        clipped_error = (old + (values - old).clamp(-clip, clip) - returns) ** 2
        per_token = torch.maximum(error, clipped_error)
        clipped_count = int(((clipped_error > error) & mask).sum())
    loss = 0.5 * (weights * per_token).sum()
    stats = ValueLossStats(
        loss=float(loss.detach()), tokens=int(mask.sum()), clipped=clipped_count,
        squared_error_sum=float(error.detach()[mask].sum()),
    )
    return loss, stats

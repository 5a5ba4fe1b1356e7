"""Losses: hand-computed GRPO / GAE examples, the decoupled objective's special cases, masking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_svc.advantages import gae, grpo_advantages, whiten
from trainer_svc.losses import (
    LossStats,
    aggregation_weights,
    decoupled_ppo_loss,
    fresh_mask,
    k3_kl,
    ppo_clip_loss,
    staleness_histogram,
    token_weights,
)
from trainer_svc.value_loss import value_loss

pytestmark = pytest.mark.unit


# --- GRPO ----------------------------------------------------------------------------------------


def test_grpo_advantages_hand_computed() -> None:
    # group a: rewards 1, 0, 0.5 -> mean 0.5, unbiased std 0.5 -> (1, -1, 0)
    # group b: equal rewards -> 0; group c: a single sample -> 0 (no baseline)
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 2.0, 3.0])
    groups = ["a", "a", "b", "a", "b", "c"]
    advantages = grpo_advantages(rewards, groups, normalize_std=True, eps=0.0)
    assert advantages.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    centred = grpo_advantages(rewards, groups, normalize_std=False)
    assert centred.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])


def test_grpo_advantages_std_of_a_larger_group() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0])  # mean 0.75, unbiased std 0.5
    advantages = grpo_advantages(rewards, ["g"] * 4, eps=0.0)
    assert advantages.tolist() == pytest.approx([-1.5, 0.5, 0.5, 0.5])


def test_grpo_advantages_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(3), ["a", "b"])


# --- aggregation ---------------------------------------------------------------------------------


def test_aggregation_weights_hand_computed() -> None:
    counts = torch.tensor([1.0, 3.0, 0.0])  # the third sample has no trainable token
    assert aggregation_weights(counts, "token_mean").tolist() == pytest.approx([0.25, 0.25, 0.0])
    assert aggregation_weights(counts, "seq_mean_token_mean").tolist() == pytest.approx([0.5, 1 / 6, 0.0])
    assert aggregation_weights(counts, "seq_mean_token_sum").tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_token_weights_aggregate_as_named() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    sample = torch.tensor([0, 0, 0, 1, 1, 1])
    token_mean = (token_weights(mask, sample, "token_mean") * values).sum()
    assert float(token_mean) == pytest.approx((1 + 2 + 4 + 5 + 6) / 5)
    seq_mean = (token_weights(mask, sample, "seq_mean_token_mean") * values).sum()
    assert float(seq_mean) == pytest.approx(((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2)
    seq_sum = (token_weights(mask, sample, "seq_mean_token_sum") * values).sum()
    assert float(seq_sum) == pytest.approx(((1 + 2) + (4 + 5 + 6)) / 2)


# --- decoupled objective -------------------------------------------------------------------------


def _tokens(seed: int, n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, generator=g) * 3
    return {
        "logprobs": (old + 0.4 * torch.randn(n, generator=g)).requires_grad_(True),
        "old": old,
        "advantages": torch.randn(n, generator=g),
        "mask": torch.rand(n, generator=g) > 0.3,
    }


def _hand_ppo(logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              eps: float) -> torch.Tensor:
    ratio = torch.exp(logprobs - old)
    per_token = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps, 1 + eps))
    return (per_token * mask).sum() / mask.sum()


@given(seed=st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_decoupled_reduces_to_ppo_when_behaviour_is_proximal(seed: int) -> None:
    t = _tokens(seed)
    weights = t["mask"].float() / t["mask"].sum()
    loss, stats = decoupled_ppo_loss(t["logprobs"], t["old"], t["old"], t["advantages"], weights, t["mask"],
                                     clip_eps=0.2, iw_cap=5.0)
    (grad,) = torch.autograd.grad(loss, t["logprobs"])
    reference = ppo_clip_loss(t["logprobs"], t["old"], t["advantages"], weights, clip_eps=0.2)
    (reference_grad,) = torch.autograd.grad(reference, t["logprobs"])
    hand = _hand_ppo(t["logprobs"], t["old"], t["advantages"], t["mask"].float(), 0.2)
    (hand_grad,) = torch.autograd.grad(hand, t["logprobs"])
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    assert float(loss.detach()) == pytest.approx(float(hand.detach()), abs=1e-6)
    assert torch.allclose(grad, reference_grad, atol=1e-7) and torch.allclose(grad, hand_grad, atol=1e-7)
    assert stats.iw_mean == pytest.approx(1.0) and stats.iw_max == pytest.approx(1.0)
    assert stats.tokens == int(t["mask"].sum())


def test_behaviour_weight_scales_the_gradient_and_is_detached() -> None:
    t = _tokens(1)
    proximal = t["old"].clone().requires_grad_(True)
    behaviour = (t["old"] - 0.3 * torch.rand(64)).requires_grad_(True)  # proximal more likely: iw > 1
    weights = t["mask"].float()
    loss, stats = decoupled_ppo_loss(t["logprobs"], proximal, behaviour, t["advantages"], weights, t["mask"],
                                     iw_cap=1.2)
    loss.backward()
    assert proximal.grad is None and behaviour.grad is None  # importance weight and anchor are constants
    iw = torch.exp(t["old"] - behaviour.detach()).clamp(max=1.2)
    plain = ppo_clip_loss(t["logprobs"], t["old"], t["advantages"] * iw, weights)
    (expected,) = torch.autograd.grad(plain, t["logprobs"])
    assert t["logprobs"].grad is not None and torch.allclose(t["logprobs"].grad, expected, atol=1e-7)
    assert stats.iw_max == pytest.approx(1.2) and stats.iw_capped > 0


def test_iw_mask_mode_drops_tokens_over_the_cap() -> None:
    t = _tokens(2, n=8)
    logprobs = t["old"].clone().requires_grad_(True)  # ratio 1: no token is PPO-clipped
    behaviour = t["old"].clone()
    behaviour[:4] -= 3.0  # iw = e^3 > cap on the first four tokens
    mask = torch.ones(8, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(logprobs, t["old"], behaviour, t["advantages"], torch.ones(8), mask,
                                     iw_cap=5.0, iw_mode="mask")
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert torch.all(grad[:4] == 0) and torch.all(grad[4:] != 0)
    assert stats.tokens == 4 and stats.iw_capped == 4


def test_stale_tokens_are_masked_and_counted() -> None:
    t = _tokens(3, n=6)
    mask = torch.tensor([0, 1, 1, 1, 1, 1], dtype=torch.bool)
    versions = torch.tensor([-1, 10, 9, 7, 6, 11])  # current 10, bound 3: staleness 0,1,3,4(stale),0
    loss, stats = decoupled_ppo_loss(t["logprobs"], t["old"], t["old"], t["advantages"], torch.ones(6), mask,
                                     versions=versions, current_version=10, max_staleness=3)
    (grad,) = torch.autograd.grad(loss, t["logprobs"])
    assert grad[0] == 0 and grad[4] == 0 and torch.all(grad[[1, 2, 3, 5]] != 0)
    assert stats.stale_tokens == 1 and stats.tokens == 4
    assert stats.staleness_histogram == [2, 1, 0, 1, 1]  # a version newer than current counts as 0
    assert fresh_mask(mask, versions, 10, None).tolist() == mask.tolist()
    assert staleness_histogram(mask, versions, 10, None) == [2, 1, 0, 1, 1]


def test_gradient_only_on_loss_masked_tokens() -> None:
    t = _tokens(4)
    loss, _ = decoupled_ppo_loss(t["logprobs"], t["old"], t["old"] - 0.1, t["advantages"], torch.ones(64),
                                 t["mask"], ref_logprobs=t["old"] - 0.2, kl_coef=0.5)
    (grad,) = torch.autograd.grad(loss, t["logprobs"])
    assert torch.all(grad[~t["mask"]] == 0) and torch.all(grad[t["mask"]] != 0)


def test_clip_fraction_counts_clipped_tokens() -> None:
    old = torch.zeros(4)
    logprobs = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.1])).requires_grad_(True)
    advantages = torch.tensor([1.0, 1.0, -1.0, 1.0])  # token 1 above 1+eps with A>0, token 2 below 1-eps with A<0
    _, stats = decoupled_ppo_loss(logprobs, old, old, advantages, torch.ones(4), torch.ones(4, dtype=torch.bool))
    assert stats.clipped == 2 and stats.clip_fraction == pytest.approx(0.5)


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    old = torch.zeros(1)
    logprobs = torch.log(torch.tensor([10.0])).requires_grad_(True)
    adv = torch.tensor([-1.0])
    one = torch.ones(1)
    mask = torch.ones(1, dtype=torch.bool)
    plain, _ = decoupled_ppo_loss(logprobs, old, old, adv, one, mask)
    bounded, _ = decoupled_ppo_loss(logprobs, old, old, adv, one, mask, dual_clip=3.0)
    assert plain.detach().item() == pytest.approx(10.0) and bounded.detach().item() == pytest.approx(3.0)


def test_k3_kl_and_penalty() -> None:
    logprobs = torch.tensor([-1.0, -2.0])
    assert k3_kl(logprobs, logprobs).tolist() == [0.0, 0.0]
    ref = torch.tensor([-1.5, -1.0])
    expected = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert k3_kl(logprobs, ref).tolist() == pytest.approx(expected)
    zero = torch.zeros(2)
    mask = torch.ones(2, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(logprobs, logprobs, logprobs, zero, torch.ones(2), mask,
                                     ref_logprobs=ref, kl_coef=0.1)
    assert float(loss) == pytest.approx(0.1 * sum(expected)) and stats.kl_ref == pytest.approx(sum(expected) / 2)


def test_loss_stats_merge() -> None:
    a = LossStats(tokens=2, clipped=1, iw_sum=2.0, iw_max=1.0, iw_min=1.0, staleness_histogram=[2])
    b = LossStats(tokens=2, clipped=0, iw_sum=3.0, iw_max=2.0, iw_min=0.5, staleness_histogram=[0, 2])
    merged = a.merge(b)
    assert merged.clip_fraction == 0.25 and merged.iw_mean == 1.25 and merged.iw_max == 2.0
    assert merged.iw_min == 0.5 and merged.staleness_histogram == [2, 2]


# --- PPO critic ------------------------------------------------------------------------------------


def test_gae_hand_computed() -> None:
    rewards = torch.tensor([0.0, 0.0, 1.0])
    values = torch.tensor([0.5, 0.6, 0.7])
    mask = torch.ones(3, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([0.5, 0.4, 0.3]) and ret.tolist() == pytest.approx([1.0, 1.0, 1.0])
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.7
    d1 = 0.9 * 0.7 - 0.6
    d0 = 0.9 * 0.6 - 0.5
    a1 = d1 + 0.45 * d2
    assert adv.tolist() == pytest.approx([d0 + 0.45 * a1, a1, d2])


def test_gae_skips_given_tokens() -> None:
    # generated, tool output (given), generated: the given token is not a time step
    rewards = torch.tensor([0.0, 0.0, 1.0])
    values = torch.tensor([0.2, 99.0, 0.4])
    mask = torch.tensor([True, False, True])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lam=1.0)
    assert adv.tolist() == pytest.approx([0.5 * 0.4 - 0.2 + 0.5 * 0.6, 0.0, 0.6])
    assert ret[1] == 0.0


def test_gae_batched_matches_rows() -> None:
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    mask = torch.rand(3, 7, generator=g) > 0.3
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for row in range(3):
        row_adv, _ = gae(rewards[row], values[row], mask[row], gamma=0.9, lam=0.8)
        assert torch.allclose(adv[row], row_adv)


def test_value_loss_clip() -> None:
    old = torch.tensor([0.0, 0.0])
    values = torch.tensor([1.0, 0.1], requires_grad=True)
    returns = torch.tensor([1.0, 1.0])
    loss, stats = value_loss(values, old, returns, torch.ones(2), torch.ones(2, dtype=torch.bool), clip=0.2)
    # token 0: unclipped error 0, clipped (0.2 - 1)^2 = 0.64 -> max 0.64; token 1: (0.1 - 1)^2 = 0.81
    assert float(loss.detach()) == pytest.approx(0.5 * (0.64 + 0.81)) and stats.clipped == 1


def test_whiten() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([True, True, True, False])
    out = whiten(values, mask)
    assert float(out[:3].mean()) == pytest.approx(0.0, abs=1e-6) and out[3] == 0.0
    assert float(out[:3].var(unbiased=False)) == pytest.approx(1.0, rel=1e-4)

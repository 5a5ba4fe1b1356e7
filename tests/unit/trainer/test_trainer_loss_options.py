"""Loss options users of verl/slime expect, each on a hand-computed example (numbers worked out in the
comments, never by the code under test): aggregation modes with Dr. GRPO's constant, DAPO clip-higher,
GSPO's sequence ratio, k1/k3 KL, the entropy term, DAPO overlong masking and soft penalty, and the
step metrics they report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.trainer.trainer_helpers import node, random_batch, trainer_config, trajectory
from trainer_svc.config import AlgorithmConfig
from trainer_svc.errors import ConfigError
from trainer_svc.losses import aggregation_weights, decoupled_ppo_loss, kl_estimate, token_entropy, token_weights
from trainer_svc.micro_batches import build_micro_batches, mask_samples, update_token_weights
from trainer_svc.overlong import call_output_lengths, overlong_penalty, response_lengths
from trainer_svc.trainer import Trainer
from trainer_svc.tree_pack import pack_tree

pytestmark = pytest.mark.unit

LN2, LN4 = math.log(2.0), math.log(4.0)


# --- aggregation ---------------------------------------------------------------------------------


def test_dr_grpo_constant_normaliser_hand_computed() -> None:
    counts = torch.tensor([1.0, 3.0, 0.0])  # S = 2 samples with tokens, C = 4: every token 1 / (2 * 4)
    weights = aggregation_weights(counts, "seq_mean_token_sum_norm", 4.0)
    assert weights.tolist() == pytest.approx([0.125, 0.125, 0.0])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    sample = torch.tensor([0, 0, 0, 1, 1, 1])
    # ((1 + 2) + (4 + 5 + 6)) / (S=2 * C=10) = 18 / 20
    aggregated = (token_weights(mask, sample, "seq_mean_token_sum_norm", 10.0) * values).sum()
    assert float(aggregated) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="constant"):
        aggregation_weights(counts, "seq_mean_token_sum_norm")


def test_per_session_mean_penalises_a_long_wrong_answer_less_per_token() -> None:
    """The length bias behind issue 15's collapse: two wrong answers (same advantage), 2 and 4 tokens."""
    counts = torch.tensor([2.0, 4.0])
    # seq_mean_token_mean: 1/(2*2) = 0.25 per short token, 1/(4*2) = 0.125 per long token
    assert aggregation_weights(counts, "seq_mean_token_mean").tolist() == pytest.approx([0.25, 0.125])
    # token_mean (DAPO): 1/6 each; Dr. GRPO with C = 4: 1/(2*4) each -- no length bias
    assert aggregation_weights(counts, "token_mean").tolist() == pytest.approx([1 / 6, 1 / 6])
    assert aggregation_weights(counts, "seq_mean_token_sum_norm", 4.0).tolist() == pytest.approx([0.125, 0.125])


def test_aggregation_config_takes_verl_spellings_and_needs_the_constant() -> None:
    config = AlgorithmConfig(aggregation="seq-mean-token-sum-norm", aggregation_constant=80.0)  # type: ignore[arg-type]
    assert config.aggregation == "seq_mean_token_sum_norm"
    assert AlgorithmConfig(aggregation="token-mean").aggregation == "token_mean"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="aggregation_constant"):
        AlgorithmConfig(aggregation="seq_mean_token_sum_norm")


# --- DAPO clip-higher ----------------------------------------------------------------------------


def _ratios(*ratios: float) -> torch.Tensor:
    return torch.tensor([math.log(r) for r in ratios]).requires_grad_(True)


def test_clip_higher_hand_computed() -> None:
    # proximal = behaviour = 0, so r = exp(logp) and the importance weight is 1; token_mean weights 1/4
    # a: r 1.25, A +1: inside 1 + 0.28 -> -1.25 (the symmetric clip 0.2 would cut it to -1.2)
    # b: r 1.30, A +1: clipped high at 1.28 -> -1.28, no gradient
    # c: r 0.70, A -1: clipped low at 0.8 -> max(0.7, 0.8) = 0.8, no gradient
    # d: r 0.70, A +1: max(-0.7, -0.8) = -0.7, unclipped
    logprobs = _ratios(1.25, 1.30, 0.70, 0.70)
    zeros, ones = torch.zeros(4), torch.ones(4, dtype=torch.bool)
    advantages = torch.tensor([1.0, 1.0, -1.0, 1.0])
    loss, stats = decoupled_ppo_loss(logprobs, zeros, zeros, advantages, torch.full((4,), 0.25), ones,
                                     clip_eps=0.2, clip_eps_high=0.28)
    assert float(loss.detach()) == pytest.approx((-1.25 - 1.28 + 0.8 - 0.7) / 4)  # -0.6075
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad.tolist() == pytest.approx([-1.25 / 4, 0.0, 0.0, -0.7 / 4])  # d(-A r w)/d logp = -A r w
    assert (stats.clip_fraction, stats.clip_fraction_high, stats.clip_fraction_low) == (0.5, 0.25, 0.25)
    symmetric, sym_stats = decoupled_ppo_loss(logprobs, zeros, zeros, advantages, torch.full((4,), 0.25), ones,
                                              clip_eps=0.2)
    assert float(symmetric.detach()) == pytest.approx((-1.2 - 1.2 + 0.8 - 0.7) / 4)  # -0.575
    assert (sym_stats.clip_fraction_high, sym_stats.clip_fraction_low) == (0.5, 0.25)


# --- GSPO ------------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_hand_computed() -> None:
    # sample 0: token ratios 1.44, 1.0 (and an untrained token at 5.0) -> s0 = sqrt(1.44) = 1.2, A = +1
    # sample 1: token ratios 0.36, 1.0 -> s1 = 0.6, A = -1: clipped low at 0.75 -> surrogate 0.75
    # eps 0.25; seq_mean_token_mean weights 1/(2*2) = 0.25 on each trained token
    logprobs = _ratios(1.44, 1.0, 5.0, 0.36, 1.0)
    zeros = torch.zeros(5)
    mask = torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool)
    sample = torch.tensor([0, 0, 0, 1, 1])
    advantages = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    weights = torch.tensor([0.25, 0.25, 0.0, 0.25, 0.25])
    loss, stats = decoupled_ppo_loss(logprobs, zeros, zeros, advantages, weights, mask, clip_eps=0.25,
                                     ratio_level="sequence", sample_index=sample)
    assert float(loss.detach()) == pytest.approx(0.25 * (-1.2 - 1.2) + 0.25 * (0.75 + 0.75))  # -0.225
    # loss of sample 0 = 2 * 0.25 * (-s0), s0 = exp((l1 + l2) / 2): d/dl_t = -0.5 * s0 / 2 = -0.3
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad.tolist() == pytest.approx([-0.3, -0.3, 0.0, 0.0, 0.0], abs=1e-6)
    assert stats.clip_fraction == 0.5 and stats.clip_fraction_low == 0.5  # both tokens of sample 1
    # token level for contrast: -1.25 (1.44 clipped at 1.25), -1.0, max(0.36, 0.75) = 0.75, 1.0
    token_level, _ = decoupled_ppo_loss(logprobs.detach(), zeros, zeros, advantages, weights, mask, clip_eps=0.25)
    assert float(token_level.detach()) == pytest.approx(0.25 * (-1.25 - 1.0 + 0.75 + 1.0))  # -0.125
    with pytest.raises(ValueError, match="sample_index"):
        decoupled_ppo_loss(logprobs, zeros, zeros, advantages, weights, mask, ratio_level="sequence")


# --- KL and entropy --------------------------------------------------------------------------------


def test_kl_estimators_hand_computed() -> None:
    logprobs = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    # k1 = logp - ref = (0.5, -1); k3 = e^d - d - 1 with d = ref - logp = (-0.5, 1)
    assert kl_estimate(logprobs, ref, "k1").tolist() == pytest.approx([0.5, -1.0])
    assert kl_estimate(logprobs, ref, "k3").tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.e - 2.0])
    zeros, ones = torch.zeros(2), torch.ones(2, dtype=torch.bool)
    # ratio 1 and advantage 0: the loss is the KL term 0.1 * sum(0.5 * k1) = 0.1 * 0.5 * (0.5 - 1)
    loss, stats = decoupled_ppo_loss(logprobs, logprobs.detach(), logprobs.detach(), zeros, torch.full((2,), 0.5),
                                     ones, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1")
    assert float(loss.detach()) == pytest.approx(-0.025) and stats.kl_loss == pytest.approx(-0.025)
    assert stats.kl_ref == pytest.approx(-0.25)  # mean of (0.5, -1)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad.tolist() == pytest.approx([0.05, 0.05])  # d(0.1 * 0.5 * logp)/d logp


def test_token_entropy_and_bonus_hand_computed() -> None:
    # vocab 4: row 0 uniform -> ln 4; row 1 two equal logits, two negligible -> ln 2
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1e4, -1e4], [3.0, 0.0, 0.0, 0.0]])
    predecessor = torch.tensor([-1, 0, 1, 1])
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)  # token 0 has no predecessor, token 3 untrained
    assert token_entropy(logits, predecessor, mask).tolist() == pytest.approx([0.0, LN4, LN2, 0.0])
    zeros = torch.zeros(4)
    entropy = token_entropy(logits, predecessor, mask)
    weights = torch.tensor([0.0, 0.5, 0.5, 0.0])
    # advantage 0: loss = -0.01 * (0.5 ln 4 + 0.5 ln 2) = -0.01 * 1.5 ln 2
    loss, stats = decoupled_ppo_loss(zeros.clone(), zeros, zeros, zeros, weights, mask & (predecessor >= 0),
                                     entropy=entropy, entropy_coef=0.01)
    assert float(loss.detach()) == pytest.approx(-0.015 * LN2) and stats.entropy_loss == pytest.approx(-0.015 * LN2)
    assert stats.entropy == pytest.approx((LN4 + LN2) / 2)
    plain, plain_stats = decoupled_ppo_loss(zeros.clone(), zeros, zeros, zeros, weights, mask & (predecessor >= 0),
                                            entropy=entropy)
    assert float(plain) == 0.0 and plain_stats.entropy == pytest.approx((LN4 + LN2) / 2)  # reported, not trained


# --- overlong handling -----------------------------------------------------------------------------


def test_soft_overlong_penalty_hand_computed() -> None:
    # L_max 10, buffer 4: free up to 6, then (6 - len) / 4, -1 from 10 on
    lengths = torch.tensor([5.0, 6.0, 8.0, 10.0, 12.0])
    assert overlong_penalty(lengths, 10, 4).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert overlong_penalty(lengths, 10, 4, penalty=0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.5])


def _branching_tree_nodes() -> tuple:
    # root: given, gen, gen; child 1: gen, given; child 2: gen, gen, gen
    # branch 1 call output = 2 + 1 = 3 tokens, branch 2 = 2 + 3 = 5 tokens
    return (node(0, -1, [1, 2, 3], [0, 1, 1]), node(1, 0, [4, 5], [1, 0]), node(2, 0, [6, 7, 8], [1, 1, 1]))


def test_call_output_lengths_and_truncation() -> None:
    tree = pack_tree(_branching_tree_nodes())
    assert call_output_lengths(tree) == [3, 5]
    two_calls = pack_tree((node(0, -1, [1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 0]),))  # runs of 2 and 1
    assert call_output_lengths(two_calls) == [2, 1]
    lengths = response_lengths([tree, two_calls], 5)
    assert lengths.longest.tolist() == [5.0, 2.0] and lengths.truncated.tolist() == [True, False]
    assert lengths.mean_call_length == pytest.approx((3 + 5 + 2 + 1) / 4) and lengths.truncated_fraction == 0.5
    assert response_lengths([tree], None).truncated.tolist() == [False]


def test_masked_samples_leave_the_loss_and_the_aggregation() -> None:
    trees = [pack_tree(_branching_tree_nodes()), pack_tree((node(0, -1, [1, 2, 3], [0, 1, 1]),))]
    micro_batches = build_micro_batches(trees, 0, 4096, None)
    mask_samples(micro_batches, torch.tensor([True, False]))
    (weights,) = update_token_weights(micro_batches, 2, "token_mean")
    # tree 0 (8 tokens) is out; tree 1's two generated tokens share the update: 1/2 each
    assert weights.tolist() == pytest.approx([0.0] * 8 + [0.0, 0.5, 0.5])


def test_overlong_config_needs_the_length_limit() -> None:
    with pytest.raises(ConfigError, match="max_response_tokens"):
        AlgorithmConfig(overlong_mask=True)
    with pytest.raises(ConfigError, match="overlong_buffer"):
        AlgorithmConfig(max_response_tokens=8, overlong_buffer=8)


# --- wired into a train step ------------------------------------------------------------------------


def test_step_reports_the_new_metrics_and_masks_truncated_sessions(tiny_model_dir: Path) -> None:
    # two sessions of one group: a truncated one (a call of 4 = max_response_tokens) and a short one
    long_one = trajectory((node(0, -1, [1, 2, 3, 4, 5], [0, 1, 1, 1, 1], logprob=-2.0),), trajectory_id="long",
                          group_id="g", reward=0.0)
    short_one = trajectory((node(0, -1, [1, 2, 3], [0, 1, 1], logprob=-2.0),), trajectory_id="short",
                           group_id="g", reward=1.0)
    algorithm = AlgorithmConfig(max_response_tokens=4, overlong_mask=True, overlong_buffer=2)
    result = Trainer(trainer_config(tiny_model_dir, algorithm=algorithm)).train_step([long_one, short_one], 0)
    assert result.num_trainable_tokens == 2  # the truncated session's 4 tokens are masked
    assert result.truncated_fraction == 0.5 and result.response_length_mean == pytest.approx((4 + 2) / 2)
    assert result.reward_mean == pytest.approx(0.5)  # as reported: the penalty only shapes advantages
    assert result.entropy > 0 and result.clip_fraction_low == result.clip_fraction_high == 0.0
    default = Trainer(trainer_config(tiny_model_dir)).train_step(random_batch(seed=3), 0)
    assert default.truncated_fraction == 0.0 and default.entropy > 0

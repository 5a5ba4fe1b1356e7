"""Sampling core: every drawn token is allowed by the truncation, and its logprob is the renormalised one."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_svc.sampling import GREEDY_TEMPERATURE_FLOOR, RowSampling, sample_rows

pytestmark = pytest.mark.unit

VOCAB = 32

rows = st.builds(
    RowSampling,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    top_p=st.sampled_from([0.05, 0.5, 0.9, 1.0]),
    top_k=st.sampled_from([-1, 1, 3, 10, VOCAB, VOCAB + 5]),
)


def reference(logits: torch.Tensor, row: RowSampling) -> torch.Tensor:
    """Log-probabilities of the truncated, renormalised distribution (-inf outside), written plainly."""
    if row.greedy:
        out = torch.full_like(logits, float("-inf"))
        out[logits.argmax()] = 0.0
        return out
    scaled = logits / row.temperature
    order = torch.argsort(scaled, descending=True)
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    k = VOCAB if row.top_k == -1 else min(row.top_k, VOCAB)
    probs = torch.softmax(scaled[order[:k]], dim=-1)
    mass = 0.0
    for rank in range(k):
        if rank > 0 and mass >= row.top_p:
            break
        allowed[order[rank]] = True
        mass += probs[rank].item()
    return torch.log_softmax(scaled.masked_fill(~allowed, float("-inf")), dim=-1)


@settings(max_examples=60, deadline=None)
@given(settings_=st.lists(rows, min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_sampled_tokens_and_logprobs_follow_the_truncated_distribution(settings_: list[RowSampling], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(settings_), VOCAB, generator=generator) * 3
    uniforms = torch.rand(len(settings_), generator=generator)
    tokens, logprobs = sample_rows(logits, settings_, uniforms)
    for i, row in enumerate(settings_):
        expected = reference(logits[i], row)
        assert torch.isfinite(expected[tokens[i]]), "drew a token the truncation removed"
        assert abs(expected[tokens[i]].item() - logprobs[i].item()) <= 1e-5


def test_uniforms_select_by_inverse_cdf() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    picks = [int(sample_rows(logits, [RowSampling()], torch.tensor([u]))[0]) for u in (0.05, 0.25, 0.55, 0.95)]
    assert picks == [0, 1, 2, 3]


def test_temperatures_below_the_floor_are_greedy_and_never_overflow() -> None:
    logits = torch.randn(4, VOCAB) * 20
    rows = [RowSampling(temperature=t) for t in (1e-39, 1e-30, GREEDY_TEMPERATURE_FLOOR / 2, 0.0)]
    assert all(row.greedy for row in rows) and not RowSampling(temperature=GREEDY_TEMPERATURE_FLOOR).greedy
    tokens, logprobs = sample_rows(logits, rows, torch.rand(4))
    assert tokens.tolist() == logits.argmax(dim=-1).tolist() and logprobs.tolist() == [0.0] * 4


@given(st.floats(min_value=GREEDY_TEMPERATURE_FLOOR, max_value=1e30), st.sampled_from([-1, 1, 3]),
       st.sampled_from([1e-300, 0.5, 1.0]))
@settings(max_examples=60, deadline=None)
def test_logprobs_are_always_finite_even_for_degenerate_logits(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(3, VOCAB) * 50
    logits[1, :5] = float("nan")
    logits[2, :] = float("-inf")
    logits[2, 7] = float("inf")
    rows = [RowSampling(temperature=temperature, top_k=top_k, top_p=top_p)] * 3
    tokens, logprobs = sample_rows(logits, rows, torch.rand(3))
    assert bool(torch.isfinite(logprobs).all()) and bool((logprobs <= 0).all())
    assert ((tokens >= 0) & (tokens < VOCAB)).all()

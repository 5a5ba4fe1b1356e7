"""Sampling core: every drawn token is allowed by the truncation, and its logprob is the renormalised one."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_svc.sampling import RowSampling, sample_rows

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

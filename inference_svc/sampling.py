"""Batched sampling: temperature, top-k, top-p, with one caller-supplied uniform per row.

The logprob returned for a token is taken under the distribution it was actually drawn from (after
temperature scaling and top-k / top-p truncation, renormalised), which is the behaviour policy an
off-policy RL correction needs. Greedy rows (temperature below `GREEDY_TEMPERATURE_FLOOR`, or top_k 1)
draw from a point mass: logprob 0. The floor exists because dividing logits by a tiny temperature
(1e-39) overflows float32 to inf and the softmax to NaN; below 1e-5 the distribution is a point mass
to float32 precision anyway, so greedy is what such a temperature means.

Every logprob returned is a finite float (JSON cannot carry NaN or inf): NaN logits count as
impossible tokens, and a token whose probability underflows reports the float32 minimum.

Randomness comes in as `uniforms` (one per row, drawn by the engine from each request's own seeded
generator), so a request's tokens do not depend on which other requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_TEMPERATURE_FLOOR = 1e-5
_LOGPROB_MIN = torch.finfo(torch.float32).min


@dataclass(frozen=True)
class RowSampling:
    """Sampling settings of one row, already validated (temperature >= 0, 0 < top_p <= 1, top_k >= 1 or -1)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_FLOOR or self.top_k == 1

    def truncates(self, vocab_size: int) -> bool:
        return self.top_p < 1.0 or 0 < self.top_k < vocab_size


def sample_rows(
    logits: torch.Tensor, settings: list[RowSampling], uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `logits` [B, V]; returns (token ids [B] int64, logprobs [B] float32)."""
    logits = torch.nan_to_num(logits.float(), nan=float("-inf"))
    batch, vocab = logits.shape
    tokens = torch.empty(batch, dtype=torch.long)
    logprobs = torch.zeros(batch, dtype=torch.float32)
    greedy_rows = [i for i, s in enumerate(settings) if s.greedy]
    plain_rows = [i for i, s in enumerate(settings) if not s.greedy and not s.truncates(vocab)]
    truncated_rows = [i for i, s in enumerate(settings) if not s.greedy and s.truncates(vocab)]
    if greedy_rows:
        idx = torch.tensor(greedy_rows)
        tokens[idx] = logits[idx].argmax(dim=-1)
    if plain_rows:
        idx = torch.tensor(plain_rows)
        temps = torch.tensor([settings[i].temperature for i in plain_rows]).unsqueeze(1)
        tok, lp = _inverse_cdf(torch.log_softmax(logits[idx] / temps, dim=-1), uniforms[idx])
        tokens[idx], logprobs[idx] = tok, lp
    if truncated_rows:
        idx = torch.tensor(truncated_rows)
        tok, lp = _sample_truncated(logits[idx], [settings[i] for i in truncated_rows], uniforms[idx])
        tokens[idx], logprobs[idx] = tok, lp
    return tokens, torch.nan_to_num(logprobs, nan=_LOGPROB_MIN, posinf=0.0, neginf=_LOGPROB_MIN)


def _inverse_cdf(logp: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick, per row, the first index whose cumulative probability reaches u * total."""
    cdf = logp.exp().cumsum(dim=-1)
    target = (uniforms.clamp(1e-12, 1.0 - 1e-7) * cdf[:, -1]).unsqueeze(1)
    picked = torch.searchsorted(cdf, target).squeeze(1).clamp(max=logp.shape[1] - 1)
    return picked, logp.gather(1, picked.unsqueeze(1)).squeeze(1)


def _sample_truncated(
    logits: torch.Tensor, settings: list[RowSampling], uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = logits.shape[1]
    temps = torch.tensor([s.temperature for s in settings]).unsqueeze(1)
    top_k = torch.tensor([s.top_k if 0 < s.top_k < vocab else vocab for s in settings]).unsqueeze(1)
    top_p = torch.tensor([s.top_p for s in settings]).unsqueeze(1)
    sorted_logits, order = torch.sort(logits / temps, dim=-1, descending=True)
    ranks = torch.arange(vocab).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p) & (ranks > 0), float("-inf"))
    picked, logprob = _inverse_cdf(torch.log_softmax(sorted_logits, dim=-1), uniforms)
    return order.gather(1, picked.unsqueeze(1)).squeeze(1), logprob

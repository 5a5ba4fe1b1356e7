"""Overlong handling (DAPO): which sessions hit the response-length limit, and the soft length penalty.

A session whose calls run into the agent's max_tokens (finish_reason length) teaches length, not the
task: cut off mid-answer it gets a low reward, and under a per-session mean loss a long wrong answer is
penalised less per token than a short one, so lengths grow until every answer is truncated (the
collapse of issue 15). DAPO answers with two independent options, both here:
  - overlong filtering: truncated sessions get no loss (`AlgorithmConfig.overlong_mask`);
  - soft overlong punishment: the reward falls linearly over the last `overlong_buffer` tokens before
    the limit (`overlong_penalty`), so length is discouraged before truncation happens.
The trainer has only the session trees, so a call's output is a maximal run of generated tokens along a
branch, and a call was truncated when that run has `max_response_tokens` tokens. Plain torch, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_svc.tree_pack import PackedTree


def call_output_lengths(tree: PackedTree) -> list[int]:
    """Lengths of the maximal runs of generated tokens of a packed tree (one per LLM call's output; a
    run that branches counts once per branch end). Tokens are packed parents first, so one pass does."""
    generated = tree.loss_mask.to(torch.bool).tolist()
    predecessor = tree.predecessor.tolist()
    run = [0] * len(generated)
    continued = [False] * len(generated)
    for i, (is_generated, p) in enumerate(zip(generated, predecessor, strict=True)):
        if not is_generated:
            continue
        if p >= 0 and generated[p]:
            run[i], continued[p] = run[p] + 1, True
        else:
            run[i] = 1
    return [run[i] for i, g in enumerate(generated) if g and not continued[i]]


def overlong_penalty(lengths: Tensor, max_tokens: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, added to each session's reward: 0 up to max_tokens - buffer,
    then falling linearly to -penalty at max_tokens, -penalty beyond. `lengths`: each session's longest
    call output."""
    excess = (lengths.to(torch.float32) - (max_tokens - buffer)).clamp(min=0.0)
    return -penalty * (excess / buffer).clamp(max=1.0)


@dataclass(frozen=True)
class ResponseLengths:
    """Per session of a step: its longest call output and whether it was truncated; and the mean call
    output length of the step (the number the collapse guard and the step metrics watch)."""

    longest: Tensor  # float32, per session
    truncated: Tensor  # bool, per session
    mean_call_length: float

    @property
    def truncated_fraction(self) -> float:
        return float(self.truncated.float().mean()) if self.truncated.numel() else 0.0


def response_lengths(trees: Sequence[PackedTree], max_response_tokens: int | None) -> ResponseLengths:
    """The response lengths of a step's session trees; nothing is truncated when the limit is unknown."""
    per_tree = [call_output_lengths(t) for t in trees]
    longest = torch.tensor([max(c, default=0) for c in per_tree], dtype=torch.float32)
    if max_response_tokens is None:
        truncated = torch.zeros(len(trees), dtype=torch.bool)
    else:
        truncated = longest >= max_response_tokens
    calls = [n for c in per_tree for n in c]
    return ResponseLengths(longest, truncated, sum(calls) / len(calls) if calls else 0.0)

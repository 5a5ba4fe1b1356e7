"""The PPO critic: the policy's transformer body with a scalar value head per token.

Initialised from the policy's base weights (as verl and OpenRLHF do) with a zero head, so its first
values are 0 and GAE starts as plain reward-to-go. It takes the same packed inputs (tree mask,
depth positions) as the policy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer_svc.errors import EngineError


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, model_path: str, attn_implementation: str) -> ValueModel:
        """The base model of a causal-LM directory (its `model.` weights) plus a fresh value head."""
        from transformers import AutoModel

        try:
            backbone = AutoModel.from_pretrained(
                model_path, dtype=torch.float32, attn_implementation=attn_implementation
            )
        except (OSError, ValueError) as e:
            raise EngineError(f"model_path={model_path!r} cannot be loaded as a critic backbone: {e}") from e
        return cls(backbone, int(backbone.config.hidden_size))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, use_cache: bool = False
    ) -> Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        ).last_hidden_state
        values: Tensor = self.value_head(hidden).squeeze(-1)
        return values

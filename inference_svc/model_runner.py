"""Batched forward of a Hugging Face decoder-only model over a slot-based KV cache.

The engine keeps one KV slot per running sequence in preallocated tensors ([slots, kv_heads, length,
head_dim] per layer, grown by doubling along the length axis). `extend` appends any number of new
tokens to any set of slots in one batched forward: a decode step is the 1-token case, a prefill (or the
re-prefill after a weight swap) is the many-token case, and a prefill that starts from a reused prefix
is the case with a non-zero offset. The layer modules of the loaded `transformers` model are called
directly (norms, projections, MLP, rotary embedding), so a weight swap into that model is seen by the
next step and numerics match a full `model(input_ids)` forward.

Supported: Llama-style attention with optional per-head q/k norms (Qwen3), qkv bias (Qwen2) and
grouped-query attention, without sliding windows. Anything else is refused with `UnsupportedModelError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from inference_svc.errors import UnsupportedModelError

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int


def model_shape(model: Any) -> ModelShape:
    """Reads the attention geometry, refusing architectures `extend` would compute wrongly."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type={config.model_type!r}: the native engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError("sliding-window attention is not supported by the native engine")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return ModelShape(
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        max_positions=config.max_position_embeddings,
    )


class SlotKVCache:
    """Per-layer K and V tensors indexed by slot; the length axis grows by doubling."""

    def __init__(
        self, shape: ModelShape, num_slots: int, initial_len: int, max_len: int, dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.shape = shape
        self.num_slots = num_slots
        self.max_len = max_len
        self.dtype = dtype
        self.device = device
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.ensure_capacity(min(initial_len, max_len))

    def ensure_capacity(self, length: int) -> None:
        if length <= self.capacity:
            return
        if length > self.max_len:
            raise ValueError(f"KV length {length} exceeds max_context {self.max_len}")
        new_capacity = max(self.capacity, 16)
        while new_capacity < length:
            new_capacity *= 2
        new_capacity = min(new_capacity, self.max_len)
        dims = (self.num_slots, self.shape.num_kv_heads, new_capacity, self.shape.head_dim)
        grown_k = [torch.zeros(dims, dtype=self.dtype, device=self.device) for _ in range(self.shape.num_layers)]
        grown_v = [torch.zeros(dims, dtype=self.dtype, device=self.device) for _ in range(self.shape.num_layers)]
        for old, new in zip(self.keys + self.values, grown_k + grown_v, strict=False):
            new[:, :, : self.capacity].copy_(old)
        self.keys, self.values, self.capacity = grown_k, grown_v, new_capacity

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Moves a sequence's first `length` cached positions to another slot (batch compaction)."""
        if src == dst or length == 0:
            return
        for cache in (*self.keys, *self.values):
            cache[dst, :, :length].copy_(cache[src, :, :length])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class BatchRunner:
    """Runs `extend` steps of one model over one `SlotKVCache`."""

    def __init__(self, model: Any, cache: SlotKVCache) -> None:
        """`model` is a transformers *ForCausalLM (typed Any: its submodules are untyped)."""
        self.model = model
        self.cache = cache
        self.shape = cache.shape
        self.device = cache.device
        inner = model.model
        self._embed: Any = inner.embed_tokens
        self._layers: list[Any] = list(inner.layers)
        self._norm: Any = inner.norm
        self._rotary: Any = inner.rotary_emb
        self._lm_head: Any = model.lm_head

    def extend(self, slots: list[int], offsets: list[int], chunks: list[list[int]]) -> torch.Tensor:
        """Appends `chunks[b]` at position `offsets[b]` of slot `slots[b]`; returns last-token logits [B, V].

        Positions below `offsets[b]` must already hold that sequence's KV (prefix, or earlier steps).
        Call it under `torch.inference_mode()` (the engine thread runs in it) or `torch.no_grad()`.
        """
        batch = len(slots)
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        kv_len = max(o + n for o, n in zip(offsets, lengths, strict=True))
        self.cache.ensure_capacity(kv_len)
        device = self.device
        ids = torch.zeros((batch, width), dtype=torch.long)
        for b, chunk in enumerate(chunks):
            ids[b, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
        ids = ids.to(device)
        offset_t = torch.tensor(offsets, dtype=torch.long, device=device)
        positions = offset_t.unsqueeze(1) + torch.arange(width, device=device).unsqueeze(0)  # [B, N]
        slot_t = torch.tensor(slots, dtype=torch.long, device=device)
        if all(n == width for n in lengths):
            write_b = torch.arange(batch, device=device).repeat_interleave(width)
            write_i = torch.arange(width, device=device).repeat(batch)
        else:
            valid = torch.arange(width, device=device).unsqueeze(0) < torch.tensor(lengths, device=device).unsqueeze(1)
            write_b, write_i = valid.nonzero(as_tuple=True)
        write_slot = slot_t[write_b]
        write_pos = positions[write_b, write_i]
        # mask[b, 0, i, j]: query i of row b may attend key position j (causal over prefix + chunk)
        mask = (torch.arange(kv_len, device=device).view(1, 1, 1, kv_len) <= positions.view(batch, 1, width, 1))
        first = slots[0]
        contiguous = slots == list(range(first, first + batch))

        hidden = self._embed(ids)
        cos, sin = self._rotary(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for layer_idx, layer in enumerate(self._layers):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(batch, width, -1, self.shape.head_dim)
            k = attn.k_proj(x).view(batch, width, -1, self.shape.head_dim)
            v = attn.v_proj(x).view(batch, width, -1, self.shape.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, N, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache_k, cache_v = self.cache.keys[layer_idx], self.cache.values[layer_idx]
            cache_k[write_slot, :, write_pos] = k.transpose(1, 2)[write_b, write_i].to(cache_k.dtype)
            cache_v[write_slot, :, write_pos] = v.transpose(1, 2)[write_b, write_i].to(cache_v.dtype)
            if contiguous:
                keys, values = cache_k[first : first + batch, :, :kv_len], cache_v[first : first + batch, :, :kv_len]
            else:
                keys, values = cache_k[slot_t, :, :kv_len], cache_v[slot_t, :, :kv_len]
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling,
                enable_gqa=self.shape.num_kv_heads != self.shape.num_heads,
            )
            hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(batch, width, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = torch.tensor(lengths, device=device) - 1
        final = self._norm(hidden[torch.arange(batch, device=device), last])
        return self._lm_head(final).float().cpu()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

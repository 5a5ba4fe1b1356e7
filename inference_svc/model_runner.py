"""Batched forward of a Hugging Face decoder-only model over a slot-based KV cache.

The engine keeps one KV slot per running sequence in preallocated tensors ([slots, kv_heads, length,
head_dim] per layer, grown by doubling along the length axis). `extend` appends any number of new
tokens to any set of slots in one batched forward: a decode step is the 1-token case, a prefill (or the
re-prefill after a weight swap) is the many-token case, and a prefill that starts from a reused prefix
is the case with a non-zero offset. It computes the layers of the loaded `transformers` model itself
(its parameters, rotary embedding and activation) with fewer kernels than `model.forward` (fused q/k/v
and gate/up matrices whose slices *are* the model's parameters, so a weight swap into the model is
seen by the next step); logprobs match a full `model(input_ids)` forward to ~1e-6 in float32.

Supported: Llama-style attention with optional per-head q/k norms (Qwen3), qkv bias (Qwen2) and
grouped-query attention, without sliding windows. Anything else is refused with `UnsupportedModelError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from schemas.inference.errors import UnsupportedModelError

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
    """Runs `extend` steps of one model over one `SlotKVCache`.

    For speed the runner fuses each layer's q/k/v projections and gate/up projections into single
    matrices, and makes the model's own parameters views into them: a weight swap that copies into
    the model's parameters (`weights.apply_state`) lands in the fused matrices with no extra copy.
    The per-head q/k norm weights are small derived copies, re-read by `refresh()` after a swap.
    """

    def __init__(self, model: Any, cache: SlotKVCache) -> None:
        """`model` is a transformers *ForCausalLM (typed Any: its submodules are untyped)."""
        self.model = model
        self.cache = cache
        self.shape = cache.shape
        self.device = cache.device
        inner = model.model
        self._embed: Any = inner.embed_tokens
        self._norm: Any = inner.norm
        self._rotary: Any = inner.rotary_emb
        self._lm_head: Any = model.lm_head
        self._layers = [_FusedLayer(layer, self.shape) for layer in inner.layers]
        half = self.shape.head_dim // 2
        # rotate_half(x) == roll(x, half) * sign: the sign is folded into sin once per step
        self._rope_sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(model.dtype).to(self.device)

    def refresh(self) -> None:
        """Re-reads the derived per-head norm weights (call after the model's weights changed)."""
        for layer in self._layers:
            layer.refresh()

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
        ids = torch.tensor([c + [0] * (width - len(c)) for c in chunks], dtype=torch.long, device=device)
        offset_t = torch.tensor(offsets, dtype=torch.long, device=device)
        positions = offset_t.unsqueeze(1) + torch.arange(width, device=device).unsqueeze(0)  # [B, N]
        slot_t = torch.tensor(slots, dtype=torch.long, device=device)
        decode = width == 1
        if decode:
            write_slot, write_pos = slot_t, offset_t
            write_b = write_i = None
        else:
            valid = torch.arange(width, device=device).unsqueeze(0) < torch.tensor(lengths, device=device).unsqueeze(1)
            write_b, write_i = valid.nonzero(as_tuple=True)
            write_slot, write_pos = slot_t[write_b], positions[write_b, write_i]
        # allowed[b, 0, i, j]: query i of row b may attend key position j (causal over prefix + chunk). One
        # row from position 0 is plain causal attention: no mask, so SDPA's fused kernel runs without
        # materializing a width x width mask (a 32K-token prompt: 1 GB of mask, 4 GB as float scores).
        plain_causal = batch == 1 and offsets[0] == 0 and not decode
        allowed = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len) <= positions.view(batch, 1, width, 1)
        first = slots[0]
        rows = slice(first, first + batch) if slots == list(range(first, first + batch)) else slot_t

        hidden = self._embed(ids)
        cos, sin = self._rotary(hidden, positions)
        cos, sin = cos.unsqueeze(2), (sin * self._rope_sign).unsqueeze(2)  # [B, N, 1, D]: broadcast over heads
        if decode:
            mask = self._decode_mask(allowed, hidden.dtype)
        for layer_idx, layer in enumerate(self._layers):
            cache_k, cache_v = self.cache.keys[layer_idx], self.cache.values[layer_idx]
            q, k, v = layer.project_qkv(hidden, cos, sin)  # [B, N, heads, D]
            if decode:
                cache_k[write_slot, :, write_pos] = k[:, 0].to(cache_k.dtype)
                cache_v[write_slot, :, write_pos] = v[:, 0].to(cache_v.dtype)
                out = layer.decode_attention(q, cache_k[rows, :, :kv_len], cache_v[rows, :, :kv_len], mask)
            else:
                cache_k[write_slot, :, write_pos] = k[write_b, write_i].to(cache_k.dtype)
                cache_v[write_slot, :, write_pos] = v[write_b, write_i].to(cache_v.dtype)
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), cache_k[rows, :, :kv_len], cache_v[rows, :, :kv_len],
                    attn_mask=None if plain_causal else allowed, is_causal=plain_causal,
                    scale=layer.sdpa_scale, enable_gqa=self.shape.num_kv_heads != self.shape.num_heads,
                ).transpose(1, 2).reshape(batch, width, -1)
            hidden = layer.finish(hidden, out)
        last = torch.tensor(lengths, device=device) - 1
        final = self._norm(hidden[torch.arange(batch, device=device), last])
        return self._lm_head(final).float().cpu()

    def _decode_mask(self, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask of the grouped decode scores [B * kv_heads, group, L], shared by every layer."""
        batch, kv_len, shape = allowed.shape[0], allowed.shape[-1], self.shape
        return (
            torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            .masked_fill_(~allowed, float("-inf"))
            .expand(batch, shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, kv_len)
            .reshape(batch * shape.num_kv_heads, -1, kv_len)
        )


class _FusedLayer:
    """One decoder layer with fused projections; numerics follow the transformers modules it wraps."""

    def __init__(self, layer: Any, shape: ModelShape) -> None:
        self.layer = layer
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
        self.group = self.heads // self.kv_heads
        self.scaling = float(attn.scaling)
        self.qkv_weight = _fuse_into_views([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv_bias = _fuse_into_views(biases) if all(b is not None for b in biases) else None
        self.gate_up_weight = _fuse_into_views([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.intermediate = mlp.gate_proj.weight.shape[0]
        self.act = mlp.act_fn
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj
        self.ln1, self.ln2 = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.qk_norm_weight: torch.Tensor | None = None
        self.refresh()

    def refresh(self) -> None:
        """Per-head q/k norm weights, with the attention scale folded into the q heads' weights."""
        if self.q_norm is not None and self.k_norm is not None:
            self.qk_norm_weight = torch.cat(
                [self.q_norm.weight.expand(self.heads, -1) * self.scaling, self.k_norm.weight.expand(self.kv_heads, -1)]
            )

    @property
    def q_prescaled(self) -> bool:
        return self.qk_norm_weight is not None

    @property
    def sdpa_scale(self) -> float:
        return 1.0 if self.q_prescaled else self.scaling

    def project_qkv(
        self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, width = hidden.shape[:2]
        qkv = F.linear(_rms(hidden, self.ln1), self.qkv_weight, self.qkv_bias)
        qkv = qkv.view(batch, width, self.heads + 2 * self.kv_heads, self.head_dim)
        qk = qkv[:, :, : self.heads + self.kv_heads]
        if self.qk_norm_weight is not None:
            assert self.q_norm is not None
            qk = _rms_with(qk, self.qk_norm_weight, self.q_norm.variance_epsilon)
        qk = qk * cos + torch.roll(qk, self.head_dim // 2, dims=-1) * signed_sin  # rotary on q and k at once
        return qk[:, :, : self.heads], qk[:, :, self.heads :], qkv[:, :, self.heads + self.kv_heads :]

    def decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """One query per row: the query heads sharing a KV head attend as one [group, L] block."""
        batch, length = q.shape[0], keys.shape[2]
        grouped = q.reshape(batch * self.kv_heads, self.group, self.head_dim)
        if not self.q_prescaled:
            grouped = grouped * self.scaling
        keys_t = keys.reshape(batch * self.kv_heads, length, self.head_dim).transpose(1, 2)
        scores = torch.baddbmm(mask, grouped, keys_t)
        out = torch.bmm(torch.softmax(scores, dim=-1), values.reshape(batch * self.kv_heads, length, self.head_dim))
        return out.reshape(batch, 1, self.heads * self.head_dim)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        flat = _linear_plus(flat, attn_out.reshape(flat.shape[0], -1), self.o_proj)
        gate, up = F.linear(_rms(flat, self.ln2), self.gate_up_weight).split(self.intermediate, dim=-1)
        return _linear_plus(flat, self.act(gate) * up, self.down_proj).view(shape)


def _linear_plus(residual: torch.Tensor, x: torch.Tensor, linear: Any) -> torch.Tensor:
    """residual + linear(x) in one kernel."""
    if linear.bias is not None:
        return residual + linear(x)
    return torch.addmm(residual, x, linear.weight.t())


def _fuse_into_views(params: list[Any]) -> torch.Tensor:
    """Concatenates parameters along dim 0 and re-points each one at its slice of the result."""
    fused = torch.cat([p.data for p in params], dim=0).contiguous()
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return _rms_with(x, norm.weight, norm.variance_epsilon)


def _rms_with(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (float32 statistics, weight applied in the input dtype), with fewer ops.

    `weight` may be per head ([heads, D]), which `F.rms_norm` does not take, hence the separate multiply.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

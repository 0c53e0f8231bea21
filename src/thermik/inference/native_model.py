"""A lean forward pass for Qwen2-, Qwen3- and Llama-shaped HF models over a slot KV cache.

transformers' decoder spends most of a small model's decode step in Python overhead (mask building, cache
objects, module hooks). This module runs the same arithmetic with a handful of fused tensor ops per layer,
reading the weights of the HF model itself: the q/k/v and gate/up parameters are re-pointed to views of fused
tensors, so a weight update copied into the model is seen here at once, with no re-fusing. Attention reads a
`SlotKVCache`: row r of the batch is cache slot `slots[r]`; its query tokens sit at positions `starts[r] + t`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from thermik.inference.kv_cache import SlotKVCache

SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run on the native path (None if it can)."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])
    ):
        return "sliding-window attention layers"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    return None


def _fuse(modules: list[torch.nn.Linear], name: str) -> Tensor | None:
    """One tensor holding the modules' `name` parameters stacked on dim 0, which the parameters become views
    of: a weight update copied into the model writes straight into the fused tensor."""
    params = [getattr(m, name) for m in modules]
    if params[0] is None:
        return None
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


class _Layer:
    """Fused projections of one decoder layer (the HF parameters are views of them)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.in_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.qkv_w = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "weight")
        self.qkv_b = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias")
        self.o = attn.o_proj
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        self.gate_up_w = _fuse([mlp.gate_proj, mlp.up_proj], "weight")
        self.down = mlp.down_proj


def _rms_norm(x: Tensor, norm: torch.nn.Module) -> Tensor:
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class NativeCausalLM:
    """Forward of a supported HF causal LM over a slot KV cache; see the module docstring."""

    def __init__(self, model: PreTrainedModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the native forward does not support this model: {reason}")
        self.model = model
        cfg = model.config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.num_layers = cfg.num_hidden_layers
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 32768))
        inner = model.model
        self.embed = inner.embed_tokens
        self.final_norm = inner.norm
        self.lm_head = model.lm_head
        self.layers = [_Layer(layer) for layer in inner.layers]
        device = self.lm_head.weight.device
        positions = torch.arange(self.max_positions, device=device)[None]
        probe = torch.zeros(1, dtype=self.lm_head.weight.dtype, device=device)
        cos, sin = inner.rotary_emb(probe, positions)
        self._cos, self._sin = cos[0], sin[0]  # [max_positions, head_dim]

    def new_cache(self, num_slots: int, max_len: int) -> SlotKVCache:
        weight = self.lm_head.weight
        return SlotKVCache(
            self.num_layers, num_slots, self.num_kv_heads, max_len, self.head_dim, weight.dtype, weight.device
        )

    @torch.inference_mode()
    def forward(
        self, tokens: Tensor, slots: Tensor | slice, starts: Tensor, last: Tensor, cache: SlotKVCache
    ) -> Tensor:
        """tokens [B, T] at positions starts[b] + t of cache slot slots[b]; returns logits [B, V] at index last[b].

        `slots` may be a slice (rows are the contiguous slots of that slice: attention reads views, no copy).
        Key/value positions past a row's last query are masked out, so stale cache content there is harmless.
        """
        batch, width = tokens.shape
        device = tokens.device
        positions = starts[:, None] + torch.arange(width, device=device)[None]  # [B, T]
        span = int(positions.max()) + 1
        if span > self.max_positions:
            raise ValueError(f"position {span - 1} exceeds the model's max_position_embeddings {self.max_positions}")
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]  # [B, 1, T, D]
        keys = torch.arange(span, device=device)
        visible = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, L]
        mask = torch.zeros(visible.shape, dtype=self._cos.dtype, device=device).masked_fill_(~visible, float("-inf"))
        rows = slots if isinstance(slots, slice) else slots[:, None]
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.in_norm)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
            qk, v = qkv.split(((nh + nkv) * hd, nkv * hd), dim=-1)
            qk = qk.view(batch, width, nh + nkv, hd)
            if layer.q_norm is not None:
                qk = torch.cat([_rms_norm(qk[:, :, :nh], layer.q_norm), _rms_norm(qk[:, :, nh:], layer.k_norm)], 2)
            q, k = _rotate(qk.transpose(1, 2), cos, sin).split((nh, nkv), dim=1)  # one RoPE for queries and keys
            v = v.view(batch, width, nkv, hd).transpose(1, 2)
            k_all, v_all = cache.write(i, rows, positions, k, v, span)
            attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=nkv != nh)
            x = x + layer.o(attn.transpose(1, 2).reshape(batch, width, nh * hd))
            h = _rms_norm(x, layer.post_norm)
            gate, up = F.linear(h, layer.gate_up_w).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        x = x[torch.arange(batch, device=device), last]
        return self.lm_head(_rms_norm(x, self.final_norm)).float()

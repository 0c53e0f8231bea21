"""A lean forward pass for Qwen2-, Qwen3- and Llama-shaped HF models over a slot KV cache.

transformers' decoder spends most of a small model's decode step in Python overhead (mask building, cache
objects, module hooks). This module runs the same arithmetic with a handful of fused tensor ops per layer,
reading the weights of the HF model itself: the q/k/v and gate/up parameters are re-pointed to views of fused
tensors, so a weight update copied into the model is seen here at once, with no re-fusing. Attention reads a
`SlotKVCache`: row r of the batch is cache slot `slots[r]`; its query tokens sit at positions `starts[r] + t`.
On a float32 or bfloat16 CPU model a decode step (one token per row) runs the elementwise work and the attention of
each layer in the fused C kernels of `cpu/kernels.py` (4 calls instead of ~15 ops); the matrix products run on
PyTorch or on `cpu/gemm.py`'s packed weights.
In bfloat16 a prefill takes the same kernels: its rows' real tokens are flattened into one list of (token, slot,
position), each attending to its slot's positions up to its own, with no padding and no mask (faster than the padded
forward on SmolLM2's prefill shapes: benchmarks/README.md, `prefill_paths.py`).

bfloat16 (docs/inference.md, "Precision"): weights, activations and the KV cache are bfloat16, as in transformers'
bfloat16 forward; the projections run on weights prepacked for oneDNN (`_Projection`); norms, RoPE, attention
scores' softmax and everything the sampler does on the logits are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from thermik.cpu import gemm
from thermik.cpu import kernels as cpu_kernels
from thermik.cpu.isa import capabilities
from thermik.inference.kv_cache import SlotKVCache
from thermik.models.architecture import apply_rope, rms_norm, unsupported_reason


def _fuse(modules: list[torch.nn.Linear], transposed: bool) -> tuple[Tensor, Tensor | None]:
    """(W, bias) of the modules' weights stacked on the output dim; the modules' weights (and biases) become views of
    these tensors, so a weight update copied into the model lands here too. `transposed`: W^T stored [in, out]
    contiguous, where `x @ W^T` runs on it (faster than `F.linear(x, W)` for decode-sized batches on CPU with
    several threads); else W [out, in] as the modules hold it (prepacked projections: a weight update is then
    a plain contiguous copy, and the prepacking reads it without a transpose)."""
    weight = torch.cat([m.weight.detach() for m in modules], dim=0)
    weight = weight.t().contiguous() if transposed else weight.contiguous()
    biases = [m.bias for m in modules]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    start = 0
    for m in modules:
        width = m.weight.shape[0]
        m.weight.data = weight[:, start : start + width].t() if transposed else weight[start : start + width]
        if bias is not None:
            m.bias.data = bias[start : start + width]
        start += width
    return weight, bias


def can_prepack(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN prepacked linear weights: bfloat16 on a CPU build with oneDNN whose bfloat16 ops run here (cpu/isa.py;
    oneDNN refuses the reorder elsewhere); float32, or bfloat16 on other CPUs, keeps `x @ W^T`."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        dtype == torch.bfloat16
        and device.type == "cpu"
        and capabilities().bf16_runs
        and torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


class _Projection:
    """`x @ W^T (+ b)` over the fused weight of one or more HF linear modules (their parameters are views of it).
    With `prepack` the weight ([out, in]) is also kept in oneDNN's blocked layout: at decode shapes a bfloat16
    product on it is faster than `x @ W^T`, whose oneDNN call re-lays the weight out every time
    (benchmarks/README.md). With a packed `fmt` ("float32", "bf16", "int8": cpu/gemm.py) a float32 weight is also
    kept in that format's panels, products run on thermik's kernels. `repack()` refreshes either copy after the
    weights change. Otherwise the weight is stored transposed for BLAS (`_fuse`)."""

    def __init__(self, modules: list[torch.nn.Linear], prepack: bool, fmt: str = "blas") -> None:
        self.prepack = prepack
        self.rows_kept = prepack or fmt != "blas"  # the weight stays [out, in]
        self.weight, self.bias = _fuse(modules, transposed=not self.rows_kept)
        self.packed: Tensor | None = None
        self.kernel = None if fmt == "blas" else gemm.Packed(self.weight, fmt)
        self.repack()

    @property
    def weight_t(self) -> Tensor:
        """W^T [in, out] (a view where the weight is kept [out, in])."""
        return self.weight.t() if self.rows_kept else self.weight

    def repack(self) -> None:
        if self.kernel is not None:
            self.kernel.repack()
        elif self.prepack:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)

    def __call__(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.bias)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        out = x @ self.weight_t
        return out if self.bias is None else out + self.bias

    def fused(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """`residual + x @ W^T (+ b)` for 2-D x, with one BLAS call (addmm) where possible (the decode step). The
        packed and prepacked paths add into `residual` in place."""
        if self.kernel is not None:
            return self.kernel(x, self.bias) if residual is None else self.kernel(x, self.bias, out=residual)
        if self.packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return out if residual is None else residual.add_(out)
        if residual is None:
            return x @ self.weight_t if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        out = torch.addmm(residual, x, self.weight_t)
        if self.bias is not None:
            out += self.bias
        return out


class _Layer:
    """Fused, transposed projections of one decoder layer (the HF parameters are views of them)."""

    def __init__(self, layer: torch.nn.Module, prepack: bool, fmt: str) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.in_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.qkv = _Projection([attn.q_proj, attn.k_proj, attn.v_proj], prepack, fmt)
        self.o = _Projection([attn.o_proj], prepack, fmt)
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        self.gate_up = _Projection([mlp.gate_proj, mlp.up_proj], prepack, fmt)
        self.down = _Projection([mlp.down_proj], prepack, fmt)

    def projections(self) -> tuple[_Projection, ...]:
        return self.qkv, self.o, self.gate_up, self.down


def _slot_ids(slots: Tensor | slice) -> Tensor:
    return torch.arange(slots.start or 0, slots.stop) if isinstance(slots, slice) else slots.to(torch.long)


def _flatten(tokens: Tensor, slots: Tensor | slice, starts: Tensor, last: Tensor) -> tuple[Tensor, ...]:
    """The real tokens of a padded prefill (row b: tokens[b, :last[b] + 1] from position starts[b] of slot slots[b])
    as one list: (tokens [N], slots [N], positions [N], each row's last token's index [B])."""
    batch = tokens.shape[0]
    slot_ids = _slot_ids(slots)
    lengths = last.to(torch.long) + 1
    row = torch.repeat_interleave(torch.arange(batch), lengths)
    ends = lengths.cumsum(0)
    offset = torch.arange(len(row)) - (ends - lengths)[row]
    return tokens[row, offset], slot_ids[row], starts[row] + offset, ends - 1


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, num_kv_heads: int) -> Tensor:
    """Attention of q [B, H, T, D] over k, v [B, KV, L, D] (grouped-query) with an additive mask [B, 1, T, L].
    A decode step (T = 1) folds each KV head's query group into one small matmul: no repeated keys/values and
    no flash-attention tiling for a single query row (faster than SDPA at decode batch sizes)."""
    batch, heads, width, dim = q.shape
    if width != 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=num_kv_heads != heads)
    grouped = q.view(batch, num_kv_heads, heads // num_kv_heads, dim) * dim**-0.5
    scores = torch.baddbmm(
        mask.view(batch, 1, 1, -1).expand(batch, num_kv_heads, heads // num_kv_heads, -1).flatten(0, 1),
        grouped.flatten(0, 1),
        k.flatten(0, 1).transpose(1, 2),
    )
    return (scores.float().softmax(-1).to(v.dtype) @ v.flatten(0, 1)).view(batch, heads, 1, dim)


class NativeCausalLM:
    """Forward of a supported HF causal LM over a slot KV cache; see the module docstring."""

    def __init__(self, model: PreTrainedModel, formats: tuple[str, ...] = ("blas",)) -> None:
        """`formats`: the projection weight formats to choose from ("blas" or cpu/gemm.py's FORMATS; one is
        taken as it is, several are timed on the model's first MLP weight and the fastest kept:
        cpu/engine_precision.py's `projection_formats`)."""
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
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        prepack = can_prepack(dtype, device)
        linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        size = sum(w.numel() * w.element_size() for w in linears)
        self.weight_format, self.format_times = gemm.choose(formats, inner.layers[0].mlp.down_proj.weight, size)
        self.layers = [_Layer(layer, prepack, self.weight_format) for layer in inner.layers]
        self.lm_head = _Projection(
            [model.lm_head], prepack, self.weight_format
        )  # tied: the embedding becomes a view too
        positions = torch.arange(self.max_positions, device=device)[None]
        # float32 tables for the C kernels; the PyTorch path uses them rounded to the model's dtype, as HF does
        cos, sin = inner.rotary_emb(torch.zeros(1, device=device), positions)
        self._cos32, self._sin32 = cos[0].contiguous(), sin[0].contiguous()  # [max_positions, head_dim]
        self._cos, self._sin = self._cos32.to(dtype), self._sin32.to(dtype)
        group_dim = self.num_heads // self.num_kv_heads * self.head_dim
        fused = device.type == "cpu" and dtype in cpu_kernels.DTYPES and self.head_dim <= cpu_kernels.MAX_HEAD_DIM
        fused = fused and group_dim <= cpu_kernels.MAX_GROUP_DIM
        self.kernels = cpu_kernels.load() if fused else None

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def refresh(self) -> None:
        """Re-derive what is computed from the weights (the prepacked copies) after they were changed in place."""
        for layer in self.layers:
            for projection in layer.projections():
                projection.repack()
        self.lm_head.repack()

    def new_cache(self, num_slots: int, max_len: int, budget_bytes: int | None = None) -> SlotKVCache:
        weight = self.lm_head.weight
        return SlotKVCache(
            self.num_layers,
            num_slots,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            weight.dtype,
            weight.device,
            budget_bytes=budget_bytes,
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
        if width == 1 and self.kernels is not None:
            return self._forward_tokens(tokens[:, 0], slots, starts, cache)
        if self.kernels is not None and self.dtype != torch.float32:  # the C attention: one row per token
            flat_tokens, flat_slots, positions, ends = _flatten(tokens, slots, starts, last)
            return self._forward_tokens(flat_tokens, flat_slots, positions, cache, at=ends)
        # The scheduler builds its index tensors on the CPU; on a GPU they go where the weights are, in one copy each.
        device = self.embed.weight.device
        tokens, starts, last = tokens.to(device), starts.to(device), last.to(device)
        slots = slots if isinstance(slots, slice) else slots.to(device)
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
            h = rms_norm(x, layer.in_norm)
            qkv = layer.qkv(h)
            qk, v = qkv.split(((nh + nkv) * hd, nkv * hd), dim=-1)
            qk = qk.view(batch, width, nh + nkv, hd)
            if layer.q_norm is not None:
                qk = torch.cat([rms_norm(qk[:, :, :nh], layer.q_norm), rms_norm(qk[:, :, nh:], layer.k_norm)], 2)
            q, k = apply_rope(qk.transpose(1, 2), cos, sin).split((nh, nkv), dim=1)  # one RoPE for queries and keys
            v = v.view(batch, width, nkv, hd).transpose(1, 2)
            k_all, v_all = cache.write(i, rows, positions, k, v, span)
            attn = _attention(q, k_all, v_all, mask, nkv)
            x = x + layer.o(attn.transpose(1, 2).reshape(batch, width, nh * hd))
            h = rms_norm(x, layer.post_norm)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        x = x[torch.arange(batch, device=device), last]
        return self.lm_head(rms_norm(x, self.final_norm)).float()

    def _forward_tokens(
        self, tokens: Tensor, slots: Tensor | slice, positions: Tensor, cache: SlotKVCache, at: Tensor | None = None
    ) -> Tensor:
        """`forward` with the fused CPU kernels for tokens [N], token i at position positions[i] of slot slots[i]:
        a decode step's rows, or a prefill's tokens flattened (every token's key and value is stored before any
        row attends, so a token sees the earlier ones of its own prefill). Returns the logits [len(at), V] of the
        tokens `at` (all when None)."""
        kernels = self.kernels
        assert kernels is not None
        batch = tokens.shape[0]
        span = int(positions.max()) + 1
        if span > self.max_positions:
            raise ValueError(f"position {span - 1} exceeds the model's max_position_embeddings {self.max_positions}")
        positions = positions.to(torch.long).contiguous()
        slot_ids = _slot_ids(slots).contiguous()
        if span > cache.max_len or int(slot_ids.max()) >= cache.num_slots:  # the C kernel writes without bounds checks
            raise IndexError(f"decode at position {span - 1} / slot {int(slot_ids.max())} is outside the KV cache")
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        lengths = positions + 1
        x = F.embedding(tokens, self.embed.weight)
        for i, layer in enumerate(self.layers):
            h = kernels.rms_norm(x, layer.in_norm.weight, layer.in_norm.variance_epsilon)
            qkv = layer.qkv.fused(h)
            qk_norm = (
                (None, None, 0.0)
                if layer.q_norm is None
                else (layer.q_norm.weight, layer.k_norm.weight, layer.q_norm.variance_epsilon)
            )
            k_buf, v_buf = cache.keys[i], cache.values[i]
            q = kernels.rope_store(
                qkv, (nh, nkv, hd), (self._cos32, self._sin32), positions, slot_ids, qk_norm, (k_buf, v_buf), hd**-0.5
            )
            attn = kernels.decode_attention(q, (k_buf, v_buf), slot_ids, lengths).view(batch, nh * hd)
            x = layer.o.fused(attn, residual=x)
            h = kernels.rms_norm(x, layer.post_norm.weight, layer.post_norm.variance_epsilon)
            gate, up = layer.gate_up.fused(h).chunk(2, dim=-1)
            x = layer.down.fused(F.silu(gate).mul_(up), residual=x)
        x = x if at is None else x[at]
        h = kernels.rms_norm(x, self.final_norm.weight, self.final_norm.variance_epsilon)
        return self.lm_head.fused(h).float()

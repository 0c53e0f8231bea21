"""The training forward's RMSNorm, RoPE and SwiGLU gate, each one op forward and one backward (kernels/train.c).

The shared-prompt forward (training/shared_prefix.py) normalises the float32 residual stream twice per layer and
casts the result to bfloat16 for the projections, and rotates every layer's queries and keys. On CPU, PyTorch runs
`rms_norm` as a composite of five elementwise passes forward and about ten backward, each with a fresh
[tokens, hidden] temporary, then the cast; RoPE is a transpose, two products (in float32, the tables' dtype), a
concatenation, a sum and a cast; the MLP's gate is a SiLU and a product, rounded to bfloat16 after each.
`RMSNormCast`, `RopeCast` and `SwiGLU` do each in one pass forward and one backward, and keep for backward only what
they read (the norm one float32 per row). Values equal the PyTorch ops' to float32 rounding (one rounding to bfloat16
where the output is bfloat16), gradients too (tested). Elsewhere (not CPU, other dtypes, THERMIK_CPU_KERNELS=0, no C
compiler) the PyTorch ops run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from thermik.cpu.kernels import DTYPES, TrainKernels, kernels_enabled, load_train
from thermik.models.architecture import apply_rope

try:
    from transformers.activations import SiLUActivation
except ImportError:  # an older transformers: its SiLU is torch's
    SiLUActivation = torch.nn.SiLU


def _kernels(*tensors: Tensor) -> TrainKernels | None:
    """The kernels where they apply to `tensors` (all on CPU), else None."""
    if not kernels_enabled() or any(t.device.type != "cpu" for t in tensors):
        return None
    return load_train()


class RMSNormCast(torch.autograd.Function):
    """RMSNorm of float32 x [..., dim] with float32 `weight` [dim], output in `dtype` (float32 or bfloat16)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, dtype: torch.dtype, kernels: TrainKernels) -> Tensor:  # type: ignore[override]
        x, weight = x.contiguous(), weight.contiguous()
        out, rstd = kernels.rms_norm_forward(x, weight, eps, dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.kernels = kernels
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_x = ctx.kernels.rms_norm_backward(x, weight, rstd, grad.contiguous(), grad_weight)
        return grad_x, grad_weight, None, None, None


class RopeCast(torch.autograd.Function):
    """x [B, T, heads, dim] rotated by float32 tables cos/sin [B, T, dim] into [B, heads, T, dim], x's dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, kernels: TrainKernels) -> Tensor:  # type: ignore[override]
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        ctx.kernels = kernels
        return kernels.rope(x.contiguous(), cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return ctx.kernels.rope(grad.contiguous(), cos, sin, backward=True), None, None, None


class SwiGLU(torch.autograd.Function):
    """silu(gate) * up (Shazeer 2020), computed in float32 and rounded once to the inputs' dtype."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor, kernels: TrainKernels) -> Tensor:  # type: ignore[override]
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        ctx.kernels = kernels
        return kernels.swiglu(gate, up)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        gate, up = ctx.saved_tensors
        return *ctx.kernels.swiglu_backward(gate, up, grad.contiguous()), None


def rms_norm_to(x: Tensor, norm: torch.nn.Module, dtype: torch.dtype) -> Tensor:
    """The model's RMSNorm module (`weight * x / rms(x)`, Llama/Qwen2/Qwen3) on x, output cast to `dtype`."""
    weight, eps = norm.weight, norm.variance_epsilon
    kernels = _kernels(x, weight)
    if kernels is not None and x.dtype == weight.dtype == torch.float32 and dtype in DTYPES:
        return RMSNormCast.apply(x, weight, eps, dtype, kernels)
    return F.rms_norm(x, weight.shape, weight, eps).to(dtype)


def rope_heads_first(x: Tensor, cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """RoPE on x [B, T, heads, dim] with tables cos/sin [B, T, dim] (in their precision), as [B, heads, T, dim] in
    `dtype`."""
    kernels = _kernels(x, cos)
    tables = cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (*x.shape[:2], x.shape[-1])
    if kernels is not None and tables and x.dtype == dtype and dtype in DTYPES and x.shape[-1] % 2 == 0:
        return RopeCast.apply(x, cos, sin, kernels)
    return apply_rope(x.transpose(1, 2), cos[:, None], sin[:, None]).to(dtype)


def gated_mlp(mlp: torch.nn.Module, h: Tensor) -> Tensor:
    """`mlp(h)` for Llama/Qwen's MLP, down(silu(gate(h)) * up(h)), its projections called as modules (adapters on
    them apply) and the gate fused (`SwiGLU`); any other MLP runs as its module."""
    act = getattr(mlp, "act_fn", None)
    if type(act) not in (SiLUActivation, torch.nn.SiLU) or not all(
        hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")
    ):
        return mlp(h)
    gate, up = mlp.gate_proj(h), mlp.up_proj(h)
    kernels = _kernels(gate)
    if kernels is not None and gate.dtype == up.dtype and gate.dtype in DTYPES and gate.shape == up.shape:
        return mlp.down_proj(SwiGLU.apply(gate, up, kernels))
    return mlp.down_proj(act(gate) * up)

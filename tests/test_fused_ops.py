"""training/fused_ops: the fused RMSNorm + cast equals `F.rms_norm(x).to(dtype)` and the fused RoPE equals
`apply_rope` on the transposed heads, values and gradients, for float32 and bfloat16, on the C kernels and on the
PyTorch fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from thermik.models.architecture import apply_rope
from thermik.training import fused_ops
from thermik.training.fused_ops import rms_norm_to, rope_heads_first


class Norm(torch.nn.Module):
    """The HF RMSNorm's attributes (`weight`, `variance_epsilon`)."""

    def __init__(self, dim: int, requires_grad: bool = True) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim, generator=gen), requires_grad=requires_grad)
        self.variance_epsilon = 1e-6


def run(norm: Norm, x: torch.Tensor, dtype: torch.dtype, fused: bool) -> tuple[torch.Tensor, ...]:
    """(output, dL/dx, dL/dweight or None) for a loss weighting every output element differently."""
    x = x.detach().clone().requires_grad_()
    norm.weight.grad = None
    if fused:
        y = rms_norm_to(x, norm, dtype)
    else:
        y = F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon).to(dtype)
    assert y.dtype == dtype
    probe = torch.linspace(-2.0, 3.0, y.numel()).view(y.shape)
    (y.float() * probe).sum().backward()
    return y.detach(), x.grad, norm.weight.grad


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_grad", [True, False])
def test_equals_the_composite(
    kernels: bool, dtype: torch.dtype, weight_grad: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not kernels:
        monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    calls = []
    monkeypatch.setattr(fused_ops.RMSNormCast, "forward", _counting(fused_ops.RMSNormCast.forward, calls))
    norm = Norm(96, weight_grad)
    x = 3 * torch.randn(2, 37, 96, generator=torch.Generator().manual_seed(0))  # rows not a multiple of threads
    got, want = run(norm, x, dtype, fused=True), run(norm, x, dtype, fused=False)
    assert len(calls) == (1 if kernels else 0)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: one rounding of the output, half an ulp
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=tolerance, rtol=tolerance)
    assert (got[2] is None) == (want[2] is None) == (not weight_grad)
    for g, w in zip(got[1:], want[1:], strict=True):
        if w is not None:
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_a_zero_row_and_a_large_one() -> None:
    """A row of zeros normalises to zeros (eps keeps rstd finite) with a finite gradient; a row of values around 1e15
    (sum of squares ~1e32, inside float32's range) matches too."""
    norm = Norm(64)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    x[1] = 0.0
    x[2] *= 1e15
    got, want = run(norm, x, torch.float32, fused=True), run(norm, x, torch.float32, fused=False)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def _counting(forward, calls: list):
    def counted(ctx, *args):
        calls.append(1)
        return forward(ctx, *args)

    return staticmethod(counted)


def rope_tables(batch: int, length: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-layout tables (each frequency twice) at arbitrary positions."""
    positions = torch.randint(0, 500, (batch, length, 1), generator=torch.Generator().manual_seed(4)).float()
    angles = positions * (10000.0 ** (-torch.arange(0, dim, 2).float() / dim))
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_equals_the_rotation_of_the_transposed_heads(
    kernels: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not kernels:
        monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    calls = []
    monkeypatch.setattr(fused_ops.RopeCast, "forward", _counting(fused_ops.RopeCast.forward, calls))
    cos, sin = rope_tables(2, 11, 16)
    x = torch.randn(2, 11, 3, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    probe = torch.linspace(-1.0, 2.0, x.numel()).view(2, 3, 11, 16)
    results = []
    for fused in (True, False):
        leaf = x.clone().requires_grad_()
        if fused:
            y = rope_heads_first(leaf, cos, sin, dtype)
        else:
            y = apply_rope(leaf.transpose(1, 2), cos[:, None], sin[:, None]).to(dtype)
        assert y.shape == (2, 3, 11, 16) and y.dtype == dtype
        (y.float() * probe).sum().backward()
        results.append((y.detach().float(), leaf.grad.float()))
    assert len(calls) == (1 if kernels else 0)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_rope_tables_that_broadcast_take_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables with batch 1 for a batch of 2 are not what the kernel reads: the PyTorch ops run, same values."""
    calls = []
    monkeypatch.setattr(fused_ops.RopeCast, "forward", _counting(fused_ops.RopeCast.forward, calls))
    cos, sin = rope_tables(1, 5, 8)
    x = torch.randn(2, 5, 2, 8)
    got = rope_heads_first(x, cos, sin, torch.float32)
    assert not calls
    torch.testing.assert_close(got, apply_rope(x.transpose(1, 2), cos[:, None], sin[:, None]))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("autocast", [False, True])
def test_gated_mlp_equals_the_module(kernels: bool, autocast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's MLP through `gated_mlp` equals the module: output, input gradient and weight gradients, in float32
    and under bfloat16 autocast (where the fused gate rounds once instead of twice)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    if not kernels:
        monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    calls = []
    monkeypatch.setattr(fused_ops.SwiGLU, "forward", _counting(fused_ops.SwiGLU.forward, calls))
    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=80, hidden_act="silu"))
    h = 2 * torch.randn(7, 32)
    probe = torch.linspace(-1.0, 1.0, 7 * 32).view(7, 32)
    results = []
    for fused in (True, False):
        mlp.zero_grad(set_to_none=True)
        leaf = h.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = fused_ops.gated_mlp(mlp, leaf) if fused else mlp(leaf)
        (y.float() * probe).sum().backward()
        results.append([y.detach().float(), leaf.grad, *(p.grad for p in mlp.parameters())])
    assert len(calls) == (1 if kernels else 0)
    tolerance = 3e-2 if autocast else 1e-5
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_an_mlp_of_another_shape_runs_as_its_module() -> None:
    class Plain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

    x = torch.randn(3, 4)
    torch.testing.assert_close(fused_ops.gated_mlp(Plain(), x), 2 * x)

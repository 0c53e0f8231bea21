"""Packed-weight matrix products for the embedded engine's float32-class projections (csrc/gemm.c).

A projection `x @ W^T (+ b)` of a float32 model can run on a copy of W packed once into column panels, in one of the
formats of `FORMATS`:

- "float32": the weights as they are (float32 arithmetic, only the summation order differs from BLAS);
- "bf16": the weights rounded to bfloat16, widened in registers, float32 arithmetic (half the memory traffic; no
  bfloat16 arithmetic, which CPUs without AVX512-BF16 or AMX run far slower than float32);
- "int8": weight-only int8 per (output column, group of `INT8_GROUP` inputs), the input rows quantized to int8 the
  same way on every call, products in integer arithmetic (AVX2 vpmaddubsw/vpmaddwd, AVX-VNNI vpdpbusd where built
  for it), one float32 scale per group.

The kernels are written for AVX2 + FMA (x86-64-v3); `available()` says whether this CPU's build has them (else the
engine keeps PyTorch's BLAS). `choose(formats, weight, ...)` times the candidate formats (and PyTorch's own product,
"blas") on one weight and answers the fastest: "auto" on a CPU without bfloat16 arithmetic picks among "blas",
"float32" and "bf16" that way (cpu/engine_precision.py). `Packed.repack()` re-derives the packed
copy after the weight changed in place (a weight update re-quantizes an int8 engine between two decode steps).
"""

from __future__ import annotations

import ctypes
import time
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from thermik.cpu import kernels
from thermik.cpu.isa import capabilities

PANEL = 16  # output columns per packed panel (gemm.c)
INT8_GROUP = 64  # inputs per int8 scale: a divisor of every hidden size the presets and SmolLM2 use
FORMATS = ("float32", "bf16", "int8")
PROBE_ROWS = 32  # rows of the timed product that picks the fastest format
TIMED_MIN_BYTES = 64 * 2**20  # smaller models keep the first format untimed: their weights sit in cache, where
# packing buys little, and a timed choice would make seeded runs of small models differ from run to run
_P, _I = ctypes.c_void_p, ctypes.c_int64


class GemmKernels:
    """ctypes bindings of csrc/gemm.c."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        for name in ("thermik_pack_f32", "thermik_pack_bf16"):
            getattr(lib, name).argtypes = [_P, _I, _I, _P, ctypes.c_int]
        for name in ("thermik_gemm_f32", "thermik_gemm_bf16w"):
            getattr(lib, name).argtypes = [_P, _I, _I, _I, _P, _I, _P, _P, _I, _I, _I]
        lib.thermik_pack_i8.argtypes = [_P, _I, _I, _I, _P, _P, ctypes.c_int]
        lib.thermik_quantize_rows.argtypes = [_P, _I, _I, _I, _I, _P, _P, _P, _I]
        lib.thermik_gemm_i8.argtypes = [_P, _P, _P, _I, _I, _I, _P, _P, _I, _P, _P, _I, _I, _I]
        for name in ("thermik_pack_f32", "thermik_pack_bf16", "thermik_gemm_f32", "thermik_gemm_bf16w"):
            getattr(lib, name).restype = None
        lib.thermik_pack_i8.restype = lib.thermik_quantize_rows.restype = lib.thermik_gemm_i8.restype = None
        self.lib = lib


@cache
def load() -> GemmKernels | None:
    """The compiled csrc/gemm.c, or None (warned once) where it cannot be built."""
    try:
        return GemmKernels(kernels.compiled("gemm"))
    except (OSError, RuntimeError) as exc:
        warnings.warn(f"thermik gemm kernels unavailable ({exc}); projections run on PyTorch's BLAS", stacklevel=2)
        return None


def available() -> bool:
    """The packed kernels run here: the CPU (as cpu/isa.py reports it) has AVX2 and FMA, and the kernels are on and
    built."""
    return capabilities().has("avx2") and kernels.kernels_enabled() and load() is not None


def _threads() -> int:
    return max(1, torch.get_num_threads())


class Packed:
    """W [out, in] (float32, kept by the caller) packed in `format`; `x @ W^T (+ bias)` on it, for float32 x."""

    def __init__(self, weight: Tensor, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown packed weight format {fmt!r}; valid formats: {', '.join(FORMATS)}")
        if weight.device.type != "cpu":  # the C kernels read host memory: a GPU model keeps PyTorch's products
            raise ValueError(f"packed weights are CPU-only, got a tensor on {weight.device}")
        if weight.dtype != torch.float32 or weight.dim() != 2 or not weight.is_contiguous():
            raise ValueError(f"packed weights need a contiguous 2-D float32 tensor, got {weight.dtype} {weight.shape}")
        lib = load()
        if lib is None:
            raise RuntimeError("the gemm kernels could not be built: install a C compiler (gcc)")
        self.lib, self.weight, self.format = lib.lib, weight, fmt
        self.out_features, self.in_features = weight.shape
        self.group = INT8_GROUP if self.in_features % INT8_GROUP == 0 else self.in_features
        if fmt == "int8" and self.group % 4:
            raise ValueError(f"int8 weights need an input size divisible by 4, got {self.in_features}")
        panels = -(-self.out_features // PANEL)
        padded = -(-self.in_features // 4) * 4
        if fmt == "int8":
            self.packed = torch.empty(panels * PANEL * padded, dtype=torch.int8)
            self.scales = torch.empty(panels * (self.in_features // self.group) * PANEL, dtype=torch.float32)
        else:
            dtype = torch.float32 if fmt == "float32" else torch.bfloat16
            self.packed = torch.empty(panels * PANEL * self.in_features, dtype=dtype)
        self.repack()

    def repack(self) -> None:
        """Re-derive the packed copy from the weight (after it changed in place)."""
        n, k = self.out_features, self.in_features
        w, out = self.weight.data_ptr(), self.packed.data_ptr()
        if self.format == "int8":
            self.lib.thermik_pack_i8(w, n, k, self.group, out, self.scales.data_ptr(), _threads())
        else:
            getattr(self.lib, f"thermik_pack_{'f32' if self.format == 'float32' else 'bf16'}")(w, n, k, out, _threads())

    def __call__(self, x: Tensor, bias: Tensor | None = None, out: Tensor | None = None) -> Tensor:
        """x [..., in] float32 -> [..., out]; with `out` (2-D, rows contiguous) the product is added into it."""
        rows = x.reshape(-1, self.in_features)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        accumulate = out is not None
        target = torch.empty(rows.shape[0], self.out_features) if out is None else out
        m, n, k = rows.shape[0], self.out_features, self.in_features
        bias_ptr = None if bias is None else bias.data_ptr()
        if self.format == "int8":
            padded = -(-k // 4) * 4
            q = torch.empty(m, padded, dtype=torch.int8)
            qa = torch.empty(m, padded, dtype=torch.uint8)
            sx = torch.empty(m, k // self.group, dtype=torch.float32)
            self.lib.thermik_quantize_rows(
                rows.data_ptr(), m, k, rows.stride(0), self.group, q.data_ptr(), qa.data_ptr(), sx.data_ptr(),
                _threads() if m >= kernels.MIN_PARALLEL_ROWS else 1,
            )  # fmt: skip
            self.lib.thermik_gemm_i8(
                q.data_ptr(), qa.data_ptr(), sx.data_ptr(), m, k, self.group, self.packed.data_ptr(),
                self.scales.data_ptr(), n, bias_ptr, target.data_ptr(), target.stride(0), accumulate, _threads(),
            )  # fmt: skip
        else:
            fn = self.lib.thermik_gemm_f32 if self.format == "float32" else self.lib.thermik_gemm_bf16w
            fn(
                rows.data_ptr(), m, k, rows.stride(0), self.packed.data_ptr(), n, bias_ptr, target.data_ptr(),
                target.stride(0), accumulate, _threads(),
            )  # fmt: skip
        return target if out is not None else target.view(*x.shape[:-1], n)


def _timed(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time of each side, run alternately `repeats` times after one warm-up call each."""
    times = {name: float("inf") for name in sides}
    for fn in sides.values():
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name] = min(times[name], time.perf_counter() - t0)
    return times


def _product(fmt: str, weight: Tensor, x: Tensor) -> Callable[[], Tensor]:
    """`x @ W^T` in format `fmt` ("blas": PyTorch's product on W^T stored for BLAS)."""
    if fmt == "blas":
        weight_t = weight.t().contiguous()
        return lambda: x @ weight_t
    packed = Packed(weight, fmt)
    return lambda: packed(x)


def choose(
    formats: tuple[str, ...], weight: Tensor, model_bytes: int, repeats: int = 5
) -> tuple[str, dict[str, float]]:
    """(format, seconds per product of each timed one) for the projections of a model holding `model_bytes` of
    projection weights: "blas" (PyTorch's product) off a float32 CPU model; the one format of `formats` as it is;
    the first below TIMED_MIN_BYTES; else the fastest of `formats` (packed ones only where `available()`) for
    `x @ W^T` on `weight` [out, in] at PROBE_ROWS rows."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return "blas", {}
    if len(formats) == 1 or model_bytes < TIMED_MIN_BYTES:
        if formats[0] != "blas" and load() is None:
            raise RuntimeError(f"projection weights {formats[0]!r} need thermik's gemm kernels: install gcc")
        return formats[0], {}
    candidates = [f for f in formats if f == "blas" or available()]
    if len(candidates) == 1:
        return candidates[0], {}
    w = weight.detach().float().contiguous()
    x = torch.randn(PROBE_ROWS, w.shape[1])
    times = _timed({fmt: _product(fmt, w, x) for fmt in candidates}, repeats)
    return min(times, key=times.__getitem__), times

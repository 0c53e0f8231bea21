"""Which floating-point precision the embedded engine samples in, and why (one log line says it).

`resolve_precision(name, ...)` is the one rule every run mode follows (local, `--split`'s inference server, Ray's
engine actors, `thermik eval`, `thermik inference`, and SFT's held-out check, which asks for its trainer's
precision): it maps a configured name to a torch dtype and a reason that names what asked for it, e.g.
"inference.precision = 'auto' and the CPU is avx512_bf16 (x86_64): native bfloat16 dot products":

- "model": whatever dtype the model was loaded in;
- "float32" / "bfloat16": that dtype (bfloat16 on a CPU whose bfloat16 ops cannot run is refused when the run is
  assembled: `isa.bf16_refusal`);
- "bf16-weights" / "int8": a float32 model whose projections run on weights packed as bfloat16 (float32 arithmetic)
  or as int8 (weight-only, per-group scales, integer products): cpu/gemm.py, docs/inference.md;
- "auto" (the default): bfloat16 on a CPU with native bfloat16 dot products (AVX512-BF16 or AMX: `isa.py`), float32
  elsewhere. On a CUDA device "auto" is bfloat16 when the GPU supports it.

`projection_formats(name, dtype, device)` says which projection weight formats the engine chooses from (cpu/gemm.py
times them when there are several): float32 "auto" on a CPU takes the fastest of PyTorch's BLAS, packed float32 and
packed bfloat16 weights (PyTorch's BLAS where THERMIK_AUTO_PRECISION=float32 pins it).

THERMIK_AUTO_PRECISION=float32 makes "auto" pick float32 on any CPU (the test suite sets it, so results do not depend
on the machine); THERMIK_CPU_ISA simulates a smaller CPU altogether (`isa.py`).
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from thermik.cpu.isa import capabilities, check_bf16

PRECISIONS: tuple[str, ...] = ("model", "float32", "bfloat16", "bf16-weights", "int8", "auto")
PACKED_PRECISIONS = {"bf16-weights": "bf16", "int8": "int8"}  # float32 models, projections on these packed weights
AUTO_PRECISION_ENV = "THERMIK_AUTO_PRECISION"

log = logging.getLogger(__name__)


def auto_pinned_to_float32() -> bool:
    """Whether THERMIK_AUTO_PRECISION pins "auto" to float32; another value fails naming the valid one."""
    value = os.environ.get(AUTO_PRECISION_ENV, "")
    if value not in ("", "float32"):
        raise ValueError(f"{AUTO_PRECISION_ENV}={value!r}: the only value is 'float32' (unset: the CPU decides)")
    return value == "float32"


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, reason) that "auto" takes on `device`: bfloat16 where it has native bfloat16 arithmetic."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return (torch.bfloat16, "the GPU supports bfloat16") if ok else (torch.float32, "the GPU lacks bfloat16")
    return cpu_auto_dtype()


def cpu_auto_dtype() -> tuple[torch.dtype, str]:
    """(dtype, reason) that "auto" takes on this CPU."""
    if auto_pinned_to_float32():
        return torch.float32, f"{AUTO_PRECISION_ENV}=float32"
    caps = capabilities()
    if caps.bf16_native:
        return torch.bfloat16, f"the CPU is {caps.describe()}: native bfloat16 dot products"
    return torch.float32, f"the CPU is {caps.describe()}: no native bfloat16 dot products (avx512_bf16 or amx)"


def resolve_precision(
    name: str, model_dtype: torch.dtype, device: torch.device, asked_by: str | None = None
) -> tuple[torch.dtype, str]:
    """(dtype, reason) for the precision `name`; unknown names fail listing the valid ones. `asked_by` says what
    asked for `name` (default: "inference.precision = <name>"); the reason starts with it."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; valid precisions: {', '.join(PRECISIONS)}")
    asked = asked_by or f"inference.precision = {name!r}"
    if name == "model":
        return model_dtype, f"{asked}: the model's own dtype"
    if name in PACKED_PRECISIONS:
        return torch.float32, f"{asked}: float32 activations, {name} projection weights"
    if name == "bfloat16" and device.type == "cpu":
        check_bf16("inference.precision", name, "cpu")  # a library caller skips run assembly's check
        if not capabilities().bf16_native:
            return torch.bfloat16, f"{asked}; without avx512_bf16 or amx it is slower than float32"
    if name != "auto":
        return getattr(torch, name), asked
    dtype, why = auto_dtype(device)
    return dtype, f"{asked} and {why}"


def projection_formats(name: str, dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    """The projection weight formats for precision `name` resolved to `dtype`: "blas" (PyTorch's product on the
    model's own weights) or cpu/gemm.py's packed formats; several are timed and the fastest kept."""
    if device.type != "cpu" or dtype != torch.float32:
        return ("blas",)
    if name in PACKED_PRECISIONS:
        return (PACKED_PRECISIONS[name],)
    if name == "auto" and auto_pinned_to_float32():
        return ("blas",)
    return {"auto": ("blas", "float32", "bf16"), "float32": ("blas", "float32")}.get(name, ("blas",))


def apply_precision(model: torch.nn.Module, name: str, asked_by: str | None = None) -> torch.nn.Module:
    """Cast `model` in place to the resolved precision and log which one runs and why (`resolve_precision`)."""
    param = next(model.parameters())
    dtype, reason = resolve_precision(name, param.dtype, param.device, asked_by)
    if dtype != param.dtype:
        model.to(dtype)
    line = f"thermik embedded engine: {str(dtype).removeprefix('torch.')} ({reason})"
    log.info(line)
    print(line, file=sys.stderr)
    return model

"""Which floating-point precision the embedded engine runs in, and why (one log line says it).

`resolve_precision(name)` maps a configured name to a torch dtype:

- "model": whatever dtype the model was loaded in;
- "float32" / "bfloat16": that dtype;
- "bf16-weights" / "int8": a float32 model whose projections run on weights packed as bfloat16 (float32 arithmetic)
  or as int8 (weight-only, per-group scales, integer products): cpu/gemm.py, docs/inference.md;
- "auto" (the default): bfloat16 on a CPU that reports AMX-BF16 or AVX512-BF16 (its matrix products then run on oneDNN's
  bfloat16 kernels, ~4x float32's rate here: benchmarks/README.md), float32 elsewhere. On a CUDA device "auto"
  is bfloat16 when the GPU supports it.

`projection_formats(name, dtype, device)` says which projection weight formats the engine chooses from (cpu/gemm.py
times them when there are several): float32 "auto" on a CPU takes the fastest of PyTorch's BLAS, packed float32 and
packed bfloat16 weights.

THERMIK_CPU_NO_BF16=1 makes the CPU check answer "no bfloat16 support" (to try "auto" as a CPU without it runs).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Literal

import torch

Precision = Literal["model", "float32", "bfloat16", "bf16-weights", "int8", "auto"]
PRECISIONS: tuple[str, ...] = ("model", "float32", "bfloat16", "bf16-weights", "int8", "auto")
PACKED_PRECISIONS = {"bf16-weights": "bf16", "int8": "int8"}  # float32 models, projections on these packed weights
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
NO_BF16_ENV = "THERMIK_CPU_NO_BF16"

log = logging.getLogger(__name__)


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The CPU flags among BF16_CPU_FLAGS that /proc/cpuinfo (or `cpuinfo`) reports; [] when simulated away."""
    if os.environ.get(NO_BF16_ENV, "0") not in ("", "0"):
        return []
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return [f for f in BF16_CPU_FLAGS if f in flags]


def resolve_precision(name: str, model_dtype: torch.dtype, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, reason) for the configured precision `name`; unknown names fail listing the valid ones."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; valid precisions: {', '.join(PRECISIONS)}")
    if name == "model":
        return model_dtype, "the model's own dtype (precision 'model')"
    if name in PACKED_PRECISIONS:
        return torch.float32, f"precision {name!r} was asked for (float32 activations, {name} projection weights)"
    if name != "auto":
        return getattr(torch, name), f"precision {name!r} was asked for"
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return (torch.bfloat16, "the GPU supports bfloat16") if ok else (torch.float32, "the GPU lacks bfloat16")
    flags = cpu_bf16_flags()
    if flags:
        return torch.bfloat16, f"the CPU reports {' and '.join(flags)}"
    wanted = " nor ".join(BF16_CPU_FLAGS)
    if os.environ.get(NO_BF16_ENV, "0") not in ("", "0"):
        return torch.float32, f"{NO_BF16_ENV} simulates a CPU with neither {wanted}"
    return torch.float32, f"the CPU reports neither {wanted}"


def projection_formats(name: str, dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    """The projection weight formats for precision `name` resolved to `dtype`: "blas" (PyTorch's product on the
    model's own weights) or cpu/gemm.py's packed formats; several are timed and the fastest kept."""
    if device.type != "cpu" or dtype != torch.float32:
        return ("blas",)
    if name in PACKED_PRECISIONS:
        return (PACKED_PRECISIONS[name],)
    return {"auto": ("blas", "float32", "bf16"), "float32": ("blas", "float32")}.get(name, ("blas",))


def apply_precision(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """Cast `model` in place to the resolved precision and log which one runs and why."""
    param = next(model.parameters())
    dtype, reason = resolve_precision(name, param.dtype, param.device)
    if dtype != param.dtype:
        model.to(dtype)
    line = f"thermik embedded engine: {str(dtype).removeprefix('torch.')} ({reason})"
    log.info(line)
    print(line, file=sys.stderr)
    return model

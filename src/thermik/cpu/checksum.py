"""The exact checksum of a tensor that the weight-checksum guard compares between trainer and engine
(assembly/guards.py) and that `thermik inference` reports for the weights it serves (GET /weight_checksums).

Each element's raw bits go through an integer mix and are summed with wrap-around: integer sums are
order-independent, so fused or strided engine tensors checksum like the trainer's, and a changed element changes the
sum (barring a 2^-32 collision).
"""

from __future__ import annotations

import torch

from thermik.cpu import kernels as cpu_kernels

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MIX = (-1640531535, 16, -2048144789)  # 0x9E3779B1, a shift, 0x85EBCA6B (as int32)


@torch.no_grad()
def checksum(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Each element's raw bits through an integer mix (multiply, xor-shift, multiply), summed with wrap-around: exact
    and order-independent, and a structured change (a tensor scaled by a power of two, negated) does not cancel out
    as it does in a plain sum of the bits. 32-bit arithmetic: faster on CPU than 64-bit. `dtype`: the
    checksum of `tensor.to(dtype)`. CPU tensors of the common types take one C pass (cpu/csrc/checksum.c), the same
    integers without the copies (benchmarks/guard_checksum.py measures both)."""
    dtype = dtype or tensor.dtype
    kernels = cpu_kernels.load_checksum() if cpu_kernels.kernels_enabled() else None
    if kernels is not None and (fast := kernels(tensor.detach(), dtype)) is not None:
        return fast
    flat = tensor.detach().to(dtype).contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    bits = flat.view(_BITS[flat.element_size()])
    h = bits.to(torch.int32) if bits.element_size() < 4 else bits.clone()
    first, shift, second = _MIX
    h *= first
    h ^= h >> shift
    h *= second
    return int(h.sum(dtype=h.dtype))

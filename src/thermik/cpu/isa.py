"""What this CPU can run fast: the one place that reads /proc/cpuinfo.

thermik cares about four instruction-set levels, each a superset of the one before:

| level         | flags it needs                              | what it gives thermik                              |
|---------------|---------------------------------------------|----------------------------------------------------|
| `generic`     | none (another architecture, an old x86)     | float32 through PyTorch; the C kernels in plain C  |
| `avx2`        | avx2, fma                                   | float32 FMA kernels (`-march=x86-64-v3`)           |
| `avx512`      | avx512f, avx512bw, avx512vl, avx512dq       | oneDNN's bfloat16 ops run (converted, not native)  |
| `avx512_bf16` | + avx512_bf16                               | native bfloat16 dot products: `auto` picks bf16    |
| `amx`         | + amx_bf16, amx_tile                        | bfloat16 matrix tiles                              |

`THERMIK_CPU_ISA=<level>` simulates a smaller CPU on a bigger one: the probe then reports that level, and the precision
choice (cpu/engine_precision.py), the C kernels' build flags (cpu/kernels.py) and the tests' feature checks follow it.
A level above what the CPU has is capped at the real one (a CPU cannot be simulated up). `torch_environment()` gives the
matching variables for PyTorch's and oneDNN's own dispatch, which must be set before torch is imported
(thermik/__init__.py does so).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ISA_ENV = "THERMIK_CPU_ISA"
LEVELS: tuple[str, ...] = ("generic", "avx2", "avx512", "avx512_bf16", "amx")
LEVEL_FLAGS: dict[str, tuple[str, ...]] = {
    "generic": (),
    "avx2": ("avx2", "fma"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avx512_bf16": ("avx512_bf16",),
    "amx": ("amx_bf16", "amx_tile"),
}
# The compiler's target per simulated level; the real level builds with -march=native.
MARCH: dict[str, tuple[str, ...]] = {
    "generic": ("-march=x86-64",),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512_bf16": ("-march=x86-64-v4", "-mavx512bf16"),
    "amx": ("-march=native",),
}
# PyTorch's kernel dispatch and oneDNN's ISA cap per simulated level (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA).
TORCH_ENV: dict[str, dict[str, str]] = {
    "generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx512_bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "amx": {},
}


@dataclass(frozen=True)
class CpuCapabilities:
    """The level this process runs as, the real one, and the flags behind them."""

    level: str
    real_level: str
    flags: frozenset[str] = field(repr=False)
    machine: str

    @property
    def simulated(self) -> bool:
        return self.level != self.real_level

    def has(self, level: str) -> bool:
        """Whether this CPU (as simulated) reaches `level`."""
        if level not in LEVELS:
            raise ValueError(f"unknown CPU level {level!r}; valid levels: {', '.join(LEVELS)}")
        return LEVELS.index(self.level) >= LEVELS.index(level)

    @property
    def bf16_native(self) -> bool:
        """Native bfloat16 dot products (AVX512-BF16 or AMX): bfloat16 runs faster than float32."""
        return self.has("avx512_bf16")

    @property
    def bf16_runs(self) -> bool:
        """oneDNN's bfloat16 ops run at all (it needs AVX512 BW/VL/DQ or AVX-NE-CONVERT); without native dot
        products they convert to float32 and run slower than float32 itself."""
        return self.has("avx512") or (not self.simulated and "avx_ne_convert" in self.flags)

    @property
    def march(self) -> tuple[str, ...]:
        """The C compiler's target flags for the kernels: native on the real CPU, the level's target when simulated."""
        if self.machine not in ("x86_64", "AMD64") or not self.simulated:
            return ("-march=native",) if self.machine in ("x86_64", "AMD64") else ("-mcpu=native",)
        return MARCH[self.level]

    def describe(self) -> str:
        """One line for logs and benchmark output: the level, and whether it is simulated."""
        if self.simulated:
            return f"{self.level} (simulated by {ISA_ENV}; the real CPU is {self.real_level})"
        return f"{self.level} ({self.machine})"

    def missing_for(self, level: str) -> str:
        """The flags `level` needs that this CPU (as simulated) lacks, for error messages."""
        needed = [f for lv in LEVELS[1 : LEVELS.index(level) + 1] for f in LEVEL_FLAGS[lv]]
        present = self.flags if not self.simulated else self._flags_up_to(self.level)
        return ", ".join(f for f in needed if f not in present) or "none"

    def _flags_up_to(self, level: str) -> frozenset[str]:
        return frozenset(f for lv in LEVELS[: LEVELS.index(level) + 1] for f in LEVEL_FLAGS[lv]) & self.flags


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags /proc/cpuinfo (or `cpuinfo`) reports; empty where it cannot be read (then the level is generic)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    return frozenset(
        f
        for line in cpuinfo.splitlines()
        if line.startswith(("flags", "Features"))
        for f in line.split(":", 1)[1].split()
    )


def level_of(flags: frozenset[str]) -> str:
    """The highest level whose flags (and every lower level's) `flags` holds."""
    level = "generic"
    for candidate in LEVELS[1:]:
        if not set(LEVEL_FLAGS[candidate]) <= flags:
            break
        level = candidate
    return level


def requested_level() -> str | None:
    """THERMIK_CPU_ISA's level, or None when unset; an unknown value fails naming the valid ones."""
    value = os.environ.get(ISA_ENV, "").strip().lower()
    if not value or value == "native":
        return None
    if value not in LEVELS:
        raise ValueError(f"{ISA_ENV}={value!r} is not a CPU level; valid levels: native, {', '.join(LEVELS)}")
    return value


def probe(cpuinfo: str | None = None) -> CpuCapabilities:
    """This CPU's capabilities as simulated by THERMIK_CPU_ISA (read each call; `capabilities()` caches)."""
    flags = cpu_flags(cpuinfo)
    real = level_of(flags)
    asked = requested_level()
    level = real if asked is None or LEVELS.index(asked) > LEVELS.index(real) else asked
    return CpuCapabilities(level=level, real_level=real, flags=flags, machine=platform.machine())


@cache
def _cached(isa: str) -> CpuCapabilities:
    del isa  # the cache key only: one probe per value of THERMIK_CPU_ISA
    return probe()


def capabilities() -> CpuCapabilities:
    """`probe()`, cached per value of THERMIK_CPU_ISA (tests change it with monkeypatch)."""
    return _cached(os.environ.get(ISA_ENV, ""))


def torch_environment(level: str | None = None) -> dict[str, str]:
    """The variables that make PyTorch and oneDNN dispatch as on `level` (default: THERMIK_CPU_ISA's level, {} when
    unset). Effective only in a process that has not imported torch yet."""
    level = level or requested_level()
    return dict(TORCH_ENV.get(level, {})) if level else {}


def bf16_refusal(key: str, value: str, device: str) -> str | None:
    """Why `key = value` (a bfloat16 precision) cannot run on this CPU, naming what is missing and what to set
    instead; None where it can (or where `device` is not the CPU). Run assembly (thermik.assembly.hardware) asks it
    before any work is done, so a config validates the same on every machine and fails on the one that runs it."""
    if not device.startswith("cpu"):
        return None
    caps = capabilities()
    if caps.bf16_runs:
        return None
    return (
        f"{key} = {value!r} needs a CPU whose bfloat16 operations run: AVX512 (avx512f, avx512bw, avx512vl, "
        f"avx512dq) or AVX-NE-CONVERT; this CPU is {caps.describe()} and lacks {caps.missing_for('avx512')}. "
        f"Set {key} = 'auto' (float32 on this CPU) or 'float32'."
    )


def check_bf16(key: str, value: str, device: str) -> None:
    """`bf16_refusal` as a ValueError, for a library caller that skips run assembly (the embedded engine)."""
    refusal = bf16_refusal(key, value, device)
    if refusal is not None:
        raise ValueError(refusal)

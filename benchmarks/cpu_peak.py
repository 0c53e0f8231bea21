"""This CPU's float32 FMA peak, measured as a large matrix product, and which instruction set a run simulates.

`fma_peak()` times a 2048 x 2048 x 2048 float32 product on PyTorch's BLAS and on thermik's packed float32 kernel
(cpu/gemm.py), each `repeats` times, and keeps the fastest rate: the practical float32 peak of this CPU at torch's
thread count (the other benchmarks print their throughput as a fraction of it). `isa_line()` says whether the run
simulates a smaller instruction set (THERMIK_CPU_ISA for thermik's kernels and precision choice,
ATEN_CPU_CAPABILITY for PyTorch's own kernels, ONEDNN_MAX_CPU_ISA for oneDNN, MKL_ENABLE_INSTRUCTIONS for MKL):
memory bandwidth and clock stay the host's, so compare ratios, not absolute rates, with a real CPU of that kind.

`--clock cpu` (here and in engine_vs_hf.py) times with this process's CPU seconds instead of wall time: on a machine
shared with other busy processes, a call longer than a scheduler slice waits for the core in wall time, and CPU
seconds leave that out. Use it with `--threads 1` (idle OpenMP workers spinning would count).

    python benchmarks/cpu_peak.py
    THERMIK_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/cpu_peak.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from thermik.cpu import gemm

SIZE = 2048
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU seconds, all threads
clock = CLOCKS["wall"]  # the benchmarks' --clock sets it
ISA_VARIABLES = ("THERMIK_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def isa_line() -> str:
    """One line: the host CPU, torch's capability, and the simulated instruction set where one is set."""
    simulated = [f"{name}={os.environ[name]}" for name in ISA_VARIABLES if os.environ.get(name)]
    host = f"{cpu_model()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}"
    if not simulated:
        return f"ISA: native ({host})"
    return f"ISA: SIMULATED {' '.join(simulated)} on {host}; bandwidth and clock are the host's"


def _rate(fn: object, repeats: int) -> float:
    best = float("inf")
    fn()  # type: ignore[operator]
    for _ in range(repeats):
        t0 = clock()
        fn()  # type: ignore[operator]
        best = min(best, clock() - t0)
    return 2 * SIZE**3 / best


def fma_peak(repeats: int = 3) -> dict[str, float]:
    """{side: FLOP/s} of the SIZE^3 float32 product: "torch" and, where the kernels run here, "thermik packed";
    "peak" is the faster."""
    a, w = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    rates = {"torch": _rate(lambda: a @ w, repeats)}
    if gemm.available():
        packed = gemm.Packed(w, "float32")
        rates["thermik packed"] = _rate(lambda: packed(a), repeats)
    rates["peak"] = max(rates.values())
    return rates


def peak_line(rates: dict[str, float]) -> str:
    sides = ", ".join(f"{name} {rate / 1e9:.0f}" for name, rate in rates.items() if name != "peak")
    threads = torch.get_num_threads()
    return f"float32 FMA peak ({SIZE}^3 matmul, {threads} threads): {rates['peak'] / 1e9:.0f} GFLOP/s ({sides})"


def add_clock_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="wall time or process CPU seconds")


def set_clock(name: str) -> None:
    global clock
    clock = CLOCKS[name]


def now() -> float:
    return clock()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_clock_argument(parser)
    args = parser.parse_args()
    set_clock(args.clock)
    print(isa_line())
    print(peak_line(fma_peak(args.repeats)))


if __name__ == "__main__":
    main()

"""Smoke tests of benchmarks/cpu_peak.py and of engine_vs_hf.py's precision rows (FMA peak, --compare, KL)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import load_benchmark
from thermik.cpu import gemm


@pytest.fixture(scope="module")
def peak_bench():
    yield from load_benchmark("cpu_peak")


@pytest.fixture(scope="module")
def engine_bench():
    yield from load_benchmark("engine_vs_hf")


def test_fma_peak_is_the_fastest_large_product(peak_bench, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peak_bench, "SIZE", 96)
    rates = peak_bench.fma_peak(repeats=1)
    assert rates["peak"] == max(rate for name, rate in rates.items() if name != "peak") > 0
    assert ("thermik packed" in rates) == gemm.available()
    assert "GFLOP/s" in peak_bench.peak_line(rates)
    for name in peak_bench.ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert peak_bench.isa_line().startswith("ISA: native")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert "SIMULATED ATEN_CPU_CAPABILITY=avx2" in peak_bench.isa_line()


@pytest.mark.skipif(gemm.load() is None, reason="no C compiler: the gemm kernels could not be built")
def test_engine_benchmark_compares_precisions_against_the_peak(engine_bench, capsys: pytest.CaptureFixture) -> None:
    """A float32 engine against an int8 one on the tiny preset: both rows, their ratio, the KL between them, the
    FMA peak and each engine's share of it are printed."""
    threads = torch.get_num_threads()
    argv = ["--preset", "qwen2-1m", "--precision", "float32", "--compare", "int8", "--batch", "2", "--max-tokens", "3",
            "--prompt-tokens", "9", "--repeats", "1", "--threads", "1", "--only", "throughput"]  # fmt: skip
    try:
        engine_bench.main(argv)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "float32 FMA peak (2048^3 matmul" in out and out.startswith("torch")
    assert "thermik int8: projection weights int8" in out
    assert re.search(r"thermik int8 / thermik float32: \d+\.\d\dx", out)
    kl = float(re.search(r"mean per-token KL\(thermik float32 \|\| thermik int8\) over 2 x 3 tokens: (\S+)", out)[1])
    assert 0 < kl < 0.5
    assert len(re.findall(r"of matmul roofline, \d+\.\d% of FMA peak", out)) == 2

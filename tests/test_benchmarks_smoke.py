"""Smoke test of benchmarks/grpo_vs_trl.py: its thermik half runs one real step; the report computes the ratio."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="the benchmark needs the `bench` extra (trl)"
)


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("grpo_vs_trl")


def test_report_prints_thermik_over_trl_ratio(bench):
    spec = bench.BenchSpec(Path("m"), Path("w"), steps=2, prompts=2, group=2, max_tokens=4, lr=1e-4, seed=0, threads=1)
    results = [
        bench.BenchResult("thermik", [1.0, 1.0], completions=8, mean_length=4.0, mean_reward=0.5),
        bench.BenchResult("trl", [2.0, 2.0], completions=8, mean_length=4.0, mean_reward=0.5),
    ]
    table = bench.format_table(results, spec)
    assert "ratio thermik/trl samples/s: 2.00x" in table
    assert results[0].samples_per_s == pytest.approx(4.0)


def test_bad_arguments_are_named(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--group", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--sides", "verl"])


@pytest.mark.slow
def test_thermik_half_runs_one_real_step(bench, capsys):
    argv = ["--preset", "qwen2-1m", "--steps", "1", "--prompts", "2", "--group", "2", "--max-tokens", "4"]
    (result,) = bench.main([*argv, "--sides", "thermik", "--threads", "1"])
    assert result.side == "thermik"
    assert result.completions == 4
    assert len(result.step_s) == 1 and result.step_s[0] > 0
    assert 1 <= result.mean_length <= 4
    assert 0.0 <= result.mean_reward <= 1.0
    out = capsys.readouterr().out
    assert "thermik" in out and "ratio" not in out  # one side only: no ratio line

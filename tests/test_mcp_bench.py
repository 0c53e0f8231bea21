"""Smoke test of benchmarks/mcp_overhead.py: the report's ratio and a tiny real run of both halves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mcp_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("mcp_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mcp_overhead"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("mcp_overhead", None)


def test_report_prints_the_ratio_and_verdict(bench):
    report = bench.format_report(bench.OverheadResult(2.0, 2.6, 64, 100.0, 200.0))
    assert "ratio pool/raw:         1.30x (above the 1.2x target)" in report
    assert "64 concurrent mcp episodes: 100.0 episodes/s" in report
    assert "(ok)" in bench.format_report(bench.OverheadResult(2.0, 2.2, 1, 1.0, 2.0))
    with pytest.raises(SystemExit):
        bench.parse_args(["--episodes", "0"])


@pytest.mark.slow
def test_tiny_real_run(bench, capsys):
    result = bench.main(["--calls", "5", "--rounds", "1", "--episodes", "4"])
    assert result.raw_ms > 0 and result.pool_ms > 0 and result.episodes_per_s > 0
    assert "ratio pool/raw" in capsys.readouterr().out

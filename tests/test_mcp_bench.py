"""Smoke test of benchmarks/mcp_overhead.py: the report's ratio and a tiny real run of both halves."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("mcp_overhead")


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

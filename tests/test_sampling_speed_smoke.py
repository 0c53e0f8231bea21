"""Smoke test of benchmarks/sampling_speed.py: both samplers run and are timed; the old one is still a valid sampler."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("sampling_speed")


def test_sampling_speed_times_both_samplers(bench, capsys) -> None:
    threads = torch.get_num_threads()
    try:
        results = bench.main(["--batch", "4", "--vocab", "600", "--rounds", "1", "--calls", "2", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert len(results) == 2 and all(old > 0 and new > 0 for old, new in results)
    assert capsys.readouterr().out.count("ratio") == 2


def test_reference_race_sampler_never_draws_filtered_tokens(bench) -> None:
    logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]]).expand(200, 4)
    ids = bench.race_sample(logits, torch.Generator().manual_seed(0), [torch.Generator().manual_seed(1)] + [None] * 199)
    assert set(ids.tolist()) == {0, 2}

"""benchmarks/time_to_reward_trl.py's report (time to each target, TRL over thermik) and async_vs_sync.py's overlap
bound, on made-up check curves and step times."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def ttr():
    if importlib.util.find_spec("trl") is None:
        pytest.skip("the benchmark needs the `bench` extra (trl)")
    yield from load_benchmark("time_to_reward_trl")


@pytest.fixture(scope="module")
def async_bench():
    yield from load_benchmark("async_vs_sync")


def curve(ttr, side: str, checks: list[tuple[int, float, float]]):
    c = ttr.Curve(side, target=0.6)
    c.checks = checks
    return c


def test_time_to_target_is_the_first_check_after_training_starts_that_reaches_it(ttr):
    c = curve(ttr, "trl", [(0, 0.0, 0.7), (5, 10.0, 0.5), (10, 20.0, 0.62), (15, 30.0, 0.58), (20, 40.0, 0.7)])
    assert c.time_to(0.6) == 20.0  # not the untimed check before the first step, which already scored 0.7
    assert c.time_to(0.65) == 40.0
    assert c.time_to(0.8) is None


def test_report_gives_trl_over_thermik_per_target_and_marks_targets_not_reached(ttr):
    curves = [
        curve(ttr, "trl", [(0, 0.0, 0.48), (5, 60.0, 0.52), (10, 120.0, 0.56)]),
        curve(ttr, "thermik-sync", [(0, 0.0, 0.48), (5, 20.0, 0.51), (10, 40.0, 0.57)]),
        curve(ttr, "thermik-async", [(0, 0.0, 0.48), (5, 15.0, 0.50), (10, 30.0, 0.54)]),
    ]
    spec = ttr.BenchSpec(Path("m"), Path("w"), 10, 16, 8, 32, 1e-3, 0, 2)
    args = argparse.Namespace(model=Path("m"), eval_size=200, eval_every=5, targets=[0.5, 0.55])
    report = ttr.format_report(curves, spec, args)
    assert "time to held-out reward, trl / thermik-sync: 0.5: 3.00x, 0.55: 3.00x" in report
    assert "time to held-out reward, trl / thermik-async: 0.5: 4.00x, 0.55: -" in report
    assert ">30 s" in report  # thermik-async never reached 0.55 within its 30 s


def test_bad_arguments_are_named(ttr, tmp_path):
    with pytest.raises(SystemExit):
        ttr.parse_args(["--model", str(tmp_path)])  # no config.json: not a model directory
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        ttr.parse_args(["--model", str(tmp_path), "--group", "1"])


@pytest.mark.parametrize(
    ("sync", "mode", "step_s", "expected"),
    [
        pytest.param(  # 2 CPU s over 2 cores take 1 s, below the slower half: the shared-cores bound is that half
            {"step_s": 3.0, "rollout_s": 2.0, "train_s": 0.9, "cpu_s": 2.0},
            "k=1, in-flight, kv keep",
            2.5,
            [
                "rollout 2.00 s, train + weight sync 0.90 s, max 2.00 s",
                "speed-up at the bound 1.50x",
                "2.00 CPU s per synchronous step over 2 cores = 1.00 s, so max 2.00 s",
                "k=1, in-flight, kv keep: 2.50 s/step = 80.0% of the overlap bound, 80.0% of the shared-cores bound",
            ],
            id="slower-half",
        ),
        pytest.param(  # the cores are busy 3.2 CPU s a step: on 2 cores no overlap finishes under 1.6 s
            {"step_s": 2.2, "rollout_s": 1.3, "train_s": 0.9, "cpu_s": 3.2},
            "split processes, k=1",
            1.6,
            [
                "max 1.30 s",
                "3.20 CPU s per synchronous step over 2 cores = 1.60 s, so max 1.60 s",
                "split processes, k=1: 1.60 s/step = 81.2% of the overlap bound, 100.0% of the shared-cores bound",
            ],
            id="cpu-work",
        ),
    ],
)
def test_bounds_of_the_synchronous_step(async_bench, capsys, monkeypatch, sync, mode, step_s, expected):
    monkeypatch.setattr(async_bench.os, "sched_getaffinity", lambda pid: {0, 1})
    rows = {"synchronous": {k: (v, 0.0) for k, v in sync.items()}, mode: {"step_s": (step_s, 0.0)}}
    async_bench.print_overlap_bound(rows)
    out = capsys.readouterr().out
    for line in expected:
        assert line in out


def test_step_halves_are_averaged_after_the_first_step(async_bench):
    records = [
        {"time/step": 9.0, "time/generate": 8.0, "time/train": 1.0, "time/weight_sync": 0.5},
        {"time/step": 3.0, "time/generate": 2.0, "time/train": 0.7, "time/weight_sync": 0.1, "time/generate_cpu": 1.5},
        {"time/step": 3.0, "time/generate": 2.2, "time/train": 0.5, "time/weight_sync": 0.1, "time/train_cpu": 0.9},
        {"progress/samples": 192.0},
    ]
    summary = async_bench._summary(3.0, 0.8, records)
    assert summary["rollout_s"] == pytest.approx(2.1)
    assert summary["train_s"] == pytest.approx(0.7)
    assert summary["cpu_s"] == pytest.approx(((1.5 + 0.1) + (0.9 + 0.1)) / 2)

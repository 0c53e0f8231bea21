"""Monitor: metrics.jsonl sink, plots, progress output."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from thermik.monitor.metrics import MetricsLogger, read_metrics
from thermik.monitor.plots import plot_run, plot_series
from thermik.monitor.progress import StepProgress, print_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_jsonl_written_and_read_back(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path / "run") as log:
        log.log(0, {"reward/mean": 0.25, "tools/calls": 3})
        log.log(1, {"reward/mean": 0.5})
        # flushed per line: readable before close
        assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 2
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["reward/mean"] == 0.25 and records[0]["tools/calls"] == 3
    assert records[1]["timestamp"] >= records[0]["timestamp"]


def test_tensor_numpy_nan_conversion(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log:
        log.log(3, {"a": torch.tensor(1.5), "b": np.float32(2.5), "c": float("nan"), "d": torch.tensor([7]), "e": True})
        with pytest.raises(TypeError, match="metric 'v' must be a scalar"):
            log.log(4, {"v": torch.ones(2)})
        with pytest.raises(TypeError, match="metric 's' must be a number"):
            log.log(4, {"s": "high"})
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(line) == 1  # the rejected calls wrote nothing
    raw = json.loads(line[0])
    assert raw["a"] == 1.5 and raw["b"] == 2.5 and raw["c"] is None and raw["d"] == 7 and raw["e"] == 1
    assert "NaN" not in line[0]


def test_truncate_after_and_resume_appends(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log:
        for s in range(5):
            log.log(s, {"x": float(s)})
    with MetricsLogger(tmp_path) as log:  # resumed run: same directory, appends
        assert log.truncate_after(3) == 2
        log.log(3, {"x": 30.0})
    records = read_metrics(tmp_path)
    assert [(r["step"], r["x"]) for r in records] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x"')
    assert read_metrics(path) == [{"step": 0, "x": 1}]
    path.write_text('{"step": 0\n{"step": 1}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1"):
        read_metrics(path)


def test_tensorboard_missing_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ImportError, match=r"pip install -e \"\.\[sinks\]\""):
        MetricsLogger(tmp_path, tensorboard=True)


def _fake_run(path: Path, steps: int = 40) -> None:
    with MetricsLogger(path) as log:
        for s in range(steps):
            metrics = {
                "reward/mean": min(1.0, s / steps + 0.1 * math.sin(s)),
                "response_length/mean": 30 + s,
                "policy/loss": 1.0 / (s + 1),
                "policy/kl": 0.01 * s,
                "policy/grad_norm": 2.0,
                "policy/clip_frac": float("nan") if s == 0 else 0.1,
            }
            if s % 10 == 0:
                metrics["eval/success"] = s / steps
            log.log(s, metrics)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_MAGIC


def test_plot_run_writes_pngs(tmp_path: Path) -> None:
    _fake_run(tmp_path)
    paths = plot_run(tmp_path / "metrics.jsonl", tmp_path)
    assert paths == [tmp_path / "plots" / "reward.png", tmp_path / "plots" / "loss.png"]
    for p in paths:
        _assert_png(p)


def test_plot_run_skips_missing_metrics(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log:
        log.log(0, {"reward/mean": 0.1})
        log.log(1, {"reward/mean": 0.2})
    assert plot_run(tmp_path / "metrics.jsonl", tmp_path) == [tmp_path / "plots" / "reward.png"]


def test_plot_series_against_wall_time(tmp_path: Path) -> None:
    _fake_run(tmp_path, steps=8)
    records = read_metrics(tmp_path)
    out = plot_series(records, "timestamp", ["reward/mean", "eval/success"], tmp_path / "p" / "wall.png")
    _assert_png(out)
    with pytest.raises(ValueError, match=r"none of \[.nope.\].*reward/mean"):
        plot_series(records, "step", ["nope"], tmp_path / "x.png")


def test_progress_disabled_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    buf = io.StringIO()
    with StepProgress(5, "train", enabled=False, console=Console(file=buf)) as p:
        for s in range(1, 6):
            p.update(s, metrics={"reward": 0.5, "step_s": 1.2})
    captured = capsys.readouterr()
    assert buf.getvalue() == "" and captured.out == "" and captured.err == ""


def test_progress_enabled_shows_metrics() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False)
    with StepProgress(4, "train", enabled=True, console=console) as p:
        p.update(4, metrics={"reward": 0.531, "step_s": 1.234})
    out = buf.getvalue()
    assert "4/4" in out and "reward 0.531" in out and "1.23 s/step" in out


def test_print_table() -> None:
    buf = io.StringIO()
    print_table("eval", ["split", "success"], [["before", 0.12345], ["after", 0.9]], Console(file=buf, width=80))
    out = buf.getvalue()
    assert "before" in out and "0.123" in out and "0.900" in out
    with pytest.raises(ValueError, match="expected 2"):
        print_table("eval", ["a", "b"], [[1]], Console(file=buf))

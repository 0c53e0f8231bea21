"""Smoke test of benchmarks/rl_step_precision.py: both precisions run the example's RL config end to end."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_bf16

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rl_step_precision.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rl_step_precision", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_step_precision"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("rl_step_precision", None)


def _args(model: Path) -> argparse.Namespace:
    prompts = ["--rollout.max_input_length=640", "--rollout.max_sequence_length=900", "--trainer.prompts_per_step=2"]
    prompts.append("--data.train_path=")  # the example's rows file is written by its run.sh: synthesize instead
    return argparse.Namespace(model=str(model), data="", steps=2, overrides=prompts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["float32", pytest.param("bf16", marks=needs_bf16)])
def test_each_precision_times_the_examples_rl_step(bench, name: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    args = _args(tiny_model_dir)
    assert name in bench.settings()  # bf16 is left out exactly where its marker skips
    timings = bench.run_once(args, f"{name}-0", tmp_path)
    assert set(timings) == set(bench.KEYS) and all(t > 0 for t in timings.values())
    config = (tmp_path / f"{name}-0" / "config.toml").read_text()
    want = ("bfloat16", "bf16-mixed") if name == "bf16" else ("float32", "float32")
    assert f'precision = "{want[0]}"' in config and f'train_precision = "{want[1]}"' in config


@pytest.mark.slow
def test_a_before_run_runs_the_exported_revisions_code(
    bench, tiny_model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """--before REV: the revision's source comes out of git and its run imports that copy, not this checkout."""
    tree = bench.export_revision("HEAD", tmp_path)
    marker = tree / "src" / "thermik" / "runs" / "local.py"
    marker.write_text(marker.read_text() + "\nprint('THERMIK FROM THE EXPORTED TREE', flush=True)\n")
    timings = bench.run_once(_args(tiny_model_dir), "float32-at-HEAD-0", tmp_path, tree)
    assert set(timings) == set(bench.KEYS) and all(t > 0 for t in timings.values())
    assert "THERMIK FROM THE EXPORTED TREE" in capfd.readouterr().out
    config = (tmp_path / "float32-at-HEAD-0" / "config.toml").read_text()
    assert "weight_checksum = false" in config  # the step at the filing had no checksum guard

"""The thinking calculator example's plumbing: `examples/thinking_calculator/run.sh --quick` runs every stage with
the Qwen3-style thinking preset, the thinking solver's conversations and rollout.step_wise "on-break", and its
report reads the run back (the recipe's numbers are in the example's README, not a test's business)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "thinking_calculator" / "run.sh"


def example_env() -> dict[str, str]:
    """This checkout's thermik and this interpreter's `thermik` and `python`."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return cli_env(PYTHONPATH=str(REPO / "src"), PATH=path)


@pytest.mark.slow
def test_quick_run_thinks_trains_step_wise_and_reports(tmp_path: Path) -> None:
    argv = ["bash", str(SCRIPT), "--quick", "--seed", "1", "--runs", str(tmp_path)]
    proc = subprocess.run(argv, env=example_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    init = tmp_path / "thinking-calculator-init"
    assert json.loads((init / "config.json").read_text())["model_type"] == "qwen3"
    assert "</think>" in (init / "chat_template.jinja").read_text()
    first = json.loads((tmp_path / "thinking-calculator-data" / "sft.jsonl").read_text().splitlines()[0])
    assert [m["content"][:9] for m in first["messages"] if m["role"] == "assistant"] == ["<think>\n\n", "<think>\nt"]
    assert (tmp_path / "thinking-calculator-sft" / "model" / "model.safetensors").is_file()
    rl = tmp_path / "thinking-calculator-rl"
    assert (rl / "export" / "model.safetensors").is_file()
    config = (rl / "config.toml").read_text()
    assert 'step_wise = "on-break"' in config and 'name = "calculator_thinking"' in config
    assert 'precision = "float32"' in config and config.count("seed = 1") >= 2
    times = [json.loads(line) for line in (tmp_path / "thinking-calculator-times.jsonl").read_text().splitlines()]
    assert [t["stage"] for t in times] == ["init", "synthesize", "sft", "rl"]
    # The report's last line: what it read from eval_before.json, eval_after.json and metrics.jsonl.
    report = json.loads(proc.stdout.strip().splitlines()[-1])["thinking_calculator"]
    assert report["problems"] == 8 and report["steps"] == 2 and 0 <= report["sft"] <= 1 and 0 <= report["grpo"] <= 1
    assert report["step_wise/samples_per_episode"] >= 1.0
    assert report["gain"] == pytest.approx(report["grpo"] - report["sft"])
    assert [k for k in report if k.startswith("stage/")] == [f"stage/{t['stage']}" for t in times]


def test_run_sh_refuses_bad_options() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--seed"], env=example_env(), capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr

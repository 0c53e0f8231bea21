"""The main job's plumbing: `examples/calculator/run.sh` runs every stage and writes its files, and
benchmarks/main_job_matrix.py reads them back (the recipe's numbers are the benchmark's business, not a test's)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_env, load_benchmark

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "calculator" / "run.sh"


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("main_job_matrix")


@pytest.mark.slow
def test_every_stage_runs_and_writes_its_files(bench, tmp_path: Path) -> None:
    result = bench.run_one("float32", 1, tmp_path, quick=True)
    out = tmp_path / "float32-s1"
    assert (out / "calculator-init" / "model.safetensors").is_file()
    assert json.loads((out / "calculator-init" / "config.json").read_text())["model_type"] == "qwen2"
    assert (out / "calculator-data" / "sft.jsonl").stat().st_size > 0
    assert (out / "calculator-sft" / "model" / "model.safetensors").is_file()
    assert (out / "calculator-rl" / "export" / "model.safetensors").is_file()
    sft_config = (out / "calculator-sft" / "config.toml").read_text()
    rl_config = (out / "calculator-rl" / "config.toml").read_text()
    assert "seed = 1" in sft_config and 'train_precision = "float32"' in sft_config
    assert 'precision = "float32"' in rl_config and 'train_precision = "float32"' in rl_config
    assert rl_config.count("seed = 1") >= 2  # the run's and its data's
    # What the benchmark read back from those files and from run.sh's stage lines.
    assert set(result.stages) == {"init", "synthesize", "sft", "rl"} and all(s > 0 for s in result.stages.values())
    assert result.sft_steps == 6 and 0 <= result.sft <= 1 and 0 <= result.rl <= 1
    assert result.wall_s >= sum(result.stages.values()) - 0.05 * len(result.stages)  # stage times print to 0.1 s
    assert result.peak_rss_gb > 0.1
    assert "trainer: float32" in result.precision and "engine: float32" in result.precision
    table = bench.table([result])
    assert "| float32 | 1 | 6 |" in table and "float32, mean [range]" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--precision", "fp8"], "--precision must be auto, float32 or bf16-mixed"), (["--seed"], "usage:")],
)
def test_run_sh_refuses_bad_options(args: list[str], message: str) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=cli_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr


def test_collect_reads_finished_runs_and_their_time_lines(bench, tmp_path: Path) -> None:
    """--collect: a run started by hand under `/usr/bin/time -v` is read back from its directory and log."""
    out = tmp_path / "auto-s2"
    for stage, name, value in [("calculator-rl", "eval_before.json", 0.4), ("calculator-rl", "eval_after.json", 0.9)]:
        (out / stage).mkdir(parents=True, exist_ok=True)
        (out / stage / name).write_text(json.dumps({"success": value, "n": 200, "problems": 200}))
    (out / "calculator-sft").mkdir()
    (out / "calculator-sft" / "sft_result.json").write_text(json.dumps({"steps": 340, "success": 0.61}))
    log = "run.sh: stage sft 101.5 s\nthermik trainer: bf16-mixed (why)\nrun.sh: stage rl 150.0 s\n"
    log += "\tElapsed (wall clock) time (h:mm:ss or m:ss): 4:31.50\n\tMaximum resident set size (kbytes): 2097152\n"
    (tmp_path / "auto-s2.log").write_text(log)
    result = bench.read_result("auto", 2, tmp_path)
    assert (result.sft_steps, result.sft, result.rl) == (340, 0.4, 0.9)
    assert result.stages == {"sft": 101.5, "rl": 150.0} and result.precision == "trainer: bf16-mixed"
    assert result.wall_s == pytest.approx(271.5) and result.peak_rss_gb == pytest.approx(2.0)
    assert result.meets_targets and result.gain == pytest.approx(0.5)
    assert result.sft_se == pytest.approx((0.4 * 0.6 / 200) ** 0.5)

"""scripts/gpu_check.sh, the one-command CUDA check (docs/gpu.md), run here on the CPU: every stage end to end at tiny
sizes (so the script is known to work up to the device), and a failing stage recorded without stopping the next."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import cli_env, needs_bf16

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["env", "tests", "calculator", "generate", "mfu", "rl_sync", "packing", "chunked_head"]


def gpu_check(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(out), *args]
    env = cli_env(PYTHON=sys.executable)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
@needs_bf16  # the check runs each stage in float32 and in bf16
def test_gpu_check_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path / "out", "--device", "cpu", "--quick", "--budget", "3000", timeout=3600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["stage"] for s in results["stages"]] == STAGES
    assert all(s["rc"] == "0" for s in results["stages"])
    assert any(line.startswith("python ") for line in results["environment"])
    for row in results["calculator"]:  # the quick run: 4 SFT steps, 2 GRPO steps, 4 held-out problems
        assert row["sft"]["steps"] == 4 and row["rl_steps"] == 2
        assert row["before"]["n"] == row["after"]["n"] == 4 and row["after"]["step"] == 2
    assert any("full bf16-mixed" in line for line in results["trainer_mfu"])
    assert any("MFU(128^3 bf16)" in line for line in results["trainer_mfu"])
    assert any(line.startswith("  transformers generate") for line in results["generation"])
    assert any(line.startswith("  thermik ") and "ratio to transformers" in line for line in results["generation"])
    parity = [line for line in results["generation"] if line.startswith(("  auto ", "  eager ", "  off "))]
    assert len(parity) == 3 and all("rows identical to auto 4/4" in line for line in parity)
    for run in results["rl_sync"]:
        assert run["steps"] == 2
        assert {"mismatch/logprob_abs_diff", "guards/parity_max_abs_diff", "time/weight_sync"} <= set(run)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Calculator main job" in summary and "FAILED" not in summary
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert "logs/stages.tsv" in names and "runs/calc-rl-bf16/metrics.jsonl" in names


@pytest.mark.slow
def test_the_trainer_stages_and_the_prepared_main_job(tmp_path: Path) -> None:
    """packing and chunked_head at tiny sizes report their figures; main_job without a model directory says so and
    passes (it runs only on a machine given --smollm2 DIR)."""
    proc = gpu_check(
        tmp_path / "out", "--device", "cpu", "--quick", "--stages", "packing,chunked_head,main_job", timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["stage"] for s in results["stages"]] == ["packing", "chunked_head", "main_job"]
    assert any(line.startswith("padded ") and "varlen" in line for line in results["packing"])
    assert any(line.startswith("peak ratio full / chunked") for line in results["chunked_head"])
    assert any("skipped, no SmolLM2" in line for line in results["main_job"])


def test_a_failing_stage_is_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    """On a machine without CUDA, the benchmark stages fail (no device): both run, both are reported, exit 1."""
    proc = gpu_check(tmp_path / "out", "--device", "cuda:99", "--quick", "--stages", "mfu,generate", timeout=600)
    assert proc.returncode == 1, proc.stdout[-4000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(s["stage"], s["rc"] != "0") for s in results["stages"]] == [("generate", True), ("mfu", True)]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## mfu: FAILED, last lines of its log" in summary and "## generate: FAILED" in summary


def test_an_unknown_option_is_refused(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path / "out", "--gpus", "2", timeout=60)
    assert proc.returncode == 2 and "unknown option --gpus" in proc.stderr


def test_the_report_reads_the_held_out_table_and_flags_a_cut_stage(tmp_path: Path) -> None:
    """The summary of a run whose RL was cut at step 80 of 120: before/after from the run's evaluations, the gain with
    its standard error, the cut stage named with the end of its log."""
    runs, logs = tmp_path / "runs" / "calc-rl-float32", tmp_path / "logs"
    runs.mkdir(parents=True)
    logs.mkdir()
    (logs / "stages.tsv").write_text("stage\trc\tseconds\tlimit\ncalculator\t124\t240.0\t240\nenv\t0\t12.5\t60\n")
    (logs / "calculator.log").write_text("thermik rl: step 80 of 120\n")
    (tmp_path / "runs" / "calc-sft-float32").mkdir()
    (tmp_path / "runs" / "calc-sft-float32" / "sft_result.json").write_text('{"steps": 1000, "success": 0.64}')
    records = [{"step": 0, "eval/success": 0.5, "eval/n": 200.0}]
    records += [{"step": s, "time/step": 0.5} for s in range(1, 81)]
    records += [{"step": 80, "eval/success": 0.8, "eval/n": 200.0}]
    (runs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check_report.py"), str(tmp_path), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["stage"] for s in results["stages"]] == ["env", "calculator"]
    row = results["calculator"][0]
    assert row["rl_steps"] == 80 and row["after"] == {"step": 80, "success": 0.8, "n": 200.0}
    assert row["gain"] == pytest.approx(0.3) and row["gain_se"] == pytest.approx((0.25 / 200 + 0.16 / 200) ** 0.5)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| calculator | timed out (rc 124) |" in summary and "thermik rl: step 80 of 120" in summary
    assert "| float32 | 1000 | 0.640 | 0.500 | 0.800 (step 80, n 200) | 0.300 ± 0.045 | 80 | 0.50 |" in summary

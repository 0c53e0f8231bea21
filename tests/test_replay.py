"""`thermik rl --record` then `thermik replay RUN --from-step S` re-runs the recorded updates of a
calculator run without an engine or environments and reproduces the weights bit for bit; a tampered record is
reported as a difference."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_thermik
from safetensors.torch import load_file, save_file

from thermik.runs.record import RECORDS

STEPS = 3


@pytest.fixture(scope="module")
def recorded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay")
    proc = run_thermik(
        "rl", "--record", "--name", "calc", "--output_dir", str(out), "--model.path", str(tiny_model_dir),
        "--env.name", "calculator", "--trainer.steps", str(STEPS), "--trainer.prompts_per_step", "2",
        "--trainer.group_size", "2", "--rollout.max_generate_length", "12", "--algorithm.entropy_coef", "0.01",
        "--data.synthetic_train_size", "16", "--data.synthetic_eval_size", "2", "--eval.before", "false",
        "--eval.size", "2", "--checkpoint.every", "1", "--checkpoint.keep", str(STEPS), "--monitor.progress", "false",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "calc"


@pytest.mark.slow
@pytest.mark.parametrize("from_step", [0, 2])
def test_replay_reproduces_the_recorded_updates_bit_for_bit(recorded: Path, from_step: int) -> None:
    proc = run_thermik("replay", str(recorded), "--from-step", str(from_step), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    n = STEPS - from_step
    assert f"replayed {n} steps from step {from_step}: {n} identical, 0 differ" in proc.stdout
    assert proc.stdout.count("weights identical") == n


@pytest.mark.slow
def test_replay_reports_a_tampered_record(recorded: Path, tmp_path: Path) -> None:
    copy = tmp_path / "calc"
    shutil.copytree(recorded, copy)
    (copy / "config.toml").write_text(
        (recorded / "config.toml").read_text().replace(str(recorded.parent), str(tmp_path))
    )
    batch_file = copy / RECORDS / "step_2" / "batch.safetensors"
    batch = load_file(str(batch_file))
    last = batch["mask"][0].nonzero()[-1]
    batch["token_rewards"][0, last] += 1.0  # one sample's reward changes: its advantage and the update change
    save_file(batch, str(batch_file))
    proc = run_thermik("replay", str(copy), "--from-step", "1", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "step 2: weights DIFFERS" in proc.stdout and "0 identical, 2 differ" in proc.stdout

"""The disk fills up during a checkpoint write (a small tmpfs mounted on the run's checkpoints directory).
The previous checkpoint stays intact, `latest` names it, and the run stops with a clear message or goes on without
saving (`checkpoint.on_write_error`). Skipped, with the reason, where a tmpfs cannot be mounted (needs root)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_thermik
from kill_suite import corrupt_checkpoints, latest_step

from thermik.monitor.metrics import read_metrics

STEPS = 3


@pytest.fixture
def small_disk(tmp_path: Path, tiny_model_dir: Path) -> Iterator[Path]:
    """runs/full/checkpoints on a tmpfs that holds one checkpoint (weights + two AdamW moments) but not two."""
    ckpt = tmp_path / "runs" / "full" / "checkpoints"
    ckpt.mkdir(parents=True)
    size = int((tiny_model_dir / "model.safetensors").stat().st_size * 4.5)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(ckpt)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip() or mount.returncode}")
    try:
        yield ckpt
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)


def _rl(model: Path, out: Path, on_error: str) -> subprocess.CompletedProcess[str]:
    return run_thermik(
        "rl", "--name", "full", "--output_dir", str(out), "--model.path", str(model), "--env.name", "reverse_text",
        "--env.max_turns", "1", "--trainer.steps", str(STEPS), "--trainer.prompts_per_step", "2",
        "--trainer.group_size", "2", "--rollout.max_generate_length", "8", "--data.synthetic_train_size", "16",
        "--data.synthetic_eval_size", "2", "--eval.before", "false", "--eval.size", "2", "--checkpoint.every", "1",
        "--checkpoint.keep", "2", "--checkpoint.on_write_error", on_error, "--monitor.progress", "false",
        timeout=300,
    )  # fmt: skip


def _previous_intact(ckpt: Path) -> None:
    assert latest_step(ckpt) == 1 and not corrupt_checkpoints(ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_1"]  # no partial .tmp_ debris


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_stops_with_a_clear_message(small_disk, tiny_model_dir, tmp_path):
    proc = _rl(tiny_model_dir, tmp_path / "runs", "stop")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "CheckpointWriteError: checkpoint step_2 could not be written" in last, proc.stderr[-2000:]
    assert "bytes free there" in last and "step_1 is intact and latest names it" in last
    _previous_intact(small_disk)


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_can_go_on_without_saving(small_disk, tiny_model_dir, tmp_path):
    proc = _rl(tiny_model_dir, tmp_path / "runs", "continue")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checkpoint step_2 could not be written" in proc.stderr and "training goes on" in proc.stderr
    steps = [r["step"] for r in read_metrics(tmp_path / "runs" / "full") if "time/step" in r]
    assert steps == list(range(1, STEPS + 1))
    _previous_intact(small_disk)

"""kill -9 during `thermik rl`, then a rerun that resumes from the last complete checkpoint (DESIGN invariant 5).

The killed run saves a checkpoint every step and is killed while it writes a new one (or, failing
that timing, just after one was published). What it leaves must hold only complete checkpoints;
the rerun of the same command must continue at checkpoint step + 1 and end with the same weights
as an uninterrupted run of the same config, which it can only do if it loaded weights, optimizer,
sampler position and RNG states from the checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import cli_env, run_thermik, thermik_argv
from safetensors.torch import load_file

from thermik.monitor.metrics import read_metrics
from thermik.training.checkpoint import MODEL_DIR, OPTIMIZER_FILE, STATE_FILE

STEPS = 8
KEEP = 2
KILL_AFTER_STEP = 2


def _rl_args(model: Path, out: Path, name: str) -> list[str]:
    return [
        "rl",
        "--name", name,
        "--output_dir", str(out),
        "--model.path", str(model),
        "--env.name", "reverse_text",
        "--env.max_turns", "1",
        "--trainer.steps", str(STEPS),
        "--trainer.prompts_per_step", "2",
        "--trainer.group_size", "2",
        "--rollout.max_generate_length", "16",
        # Untrained rewards are all 0, so advantages are 0: the entropy term keeps every step moving the weights.
        "--algorithm.entropy_coef", "0.01",
        "--data.synthetic_train_size", "64",
        "--data.synthetic_eval_size", "4",
        "--eval.before", "false",
        "--eval.size", "2",
        "--checkpoint.every", "1",
        "--checkpoint.keep", str(KEEP),
        "--monitor.progress", "false",
        "--monitor.save_trajectories_every", "0",
    ]  # fmt: skip


def _latest_step(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text().strip().removeprefix("step_"))
    except (FileNotFoundError, ValueError):
        return -1


def _is_complete(step_dir: Path) -> bool:
    return (
        any((step_dir / MODEL_DIR).glob("*.safetensors"))
        and (step_dir / OPTIMIZER_FILE).is_file()
        and (step_dir / STATE_FILE).is_file()
    )


def _kill_mid_checkpoint(proc: subprocess.Popen[bytes], ckpt: Path, deadline_s: float = 90) -> str:
    """SIGKILL `proc` once `latest` >= KILL_AFTER_STEP, preferably while a `.tmp_step_*` is being written."""
    start = time.monotonic()
    while _latest_step(ckpt) < KILL_AFTER_STEP:
        if proc.poll() is not None:
            pytest.fail(f"thermik rl exited with {proc.returncode} before step {KILL_AFTER_STEP}; see killed.log")
        if time.monotonic() - start > deadline_s:
            pytest.fail(f"no checkpoint step {KILL_AFTER_STEP} within {deadline_s} s")
        time.sleep(0.005)
    phase = "after a checkpoint was published"
    wait_until = time.monotonic() + 3.0
    while time.monotonic() < wait_until and proc.poll() is None:
        if any(p.name.startswith(".tmp_step_") for p in ckpt.iterdir()):
            phase = "while a checkpoint was being written"
            break
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run ended by itself before it could be killed: raise STEPS"
    return phase


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    files = sorted((run_dir / "checkpoints" / f"step_{step}" / MODEL_DIR).glob("*.safetensors"))
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def _train_records(run_dir: Path) -> list[dict]:
    """Per-step training records (the final held-out eval is logged as an extra record at the last step)."""
    return [r for r in read_metrics(run_dir) if "time/step" in r]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `thermik ARGS` in the background (stderr to a file); whatever still runs at teardown is killed."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, log: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / log, "wb") as err:
            argv = thermik_argv(*args)
            procs.append(subprocess.Popen(argv, env=cli_env(), stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_kill_during_training_then_rerun_resumes(
    tiny_model_dir: Path, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    out = tmp_path / "runs"
    run_dir, ckpt = out / "killed", out / "killed" / "checkpoints"
    args = _rl_args(tiny_model_dir, out, "killed")

    # An uninterrupted run of the same config, in parallel, for the comparison at the end.
    reference = spawn(*_rl_args(tiny_model_dir, out, "reference"), log="reference.log")
    phase = _kill_mid_checkpoint(spawn(*args, log="killed.log"), ckpt)
    killed_at = time.time()

    # What the killed run left: only complete checkpoints, `latest` naming one of them, at most `keep`.
    step_dirs = sorted(p for p in ckpt.iterdir() if p.name.startswith("step_"))
    incomplete = [p.name for p in step_dirs if not _is_complete(p)]
    assert not incomplete, f"incomplete checkpoints after kill -9 {phase}: {incomplete}"
    assert 1 <= len(step_dirs) <= KEEP, [p.name for p in step_dirs]
    resume_step = _latest_step(ckpt)
    assert resume_step >= KILL_AFTER_STEP and _is_complete(ckpt / f"step_{resume_step}")
    assert json.loads((ckpt / f"step_{resume_step}" / STATE_FILE).read_text())["step"] == resume_step
    assert resume_step < STEPS
    before_rerun = {r["step"]: r["timestamp"] for r in _train_records(run_dir)}
    assert set(range(1, resume_step + 1)) <= set(before_rerun), sorted(before_rerun)

    # The same command again: it resumes and runs to the end.
    rerun = run_thermik(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    records = _train_records(run_dir)
    steps = [r["step"] for r in records]
    assert steps == list(range(1, STEPS + 1)), f"resumed from step {resume_step} ({phase}): logged steps {steps}"
    for r in records:
        if r["step"] <= resume_step:  # kept from the killed run, not re-run
            assert r["timestamp"] == before_rerun[r["step"]] and r["timestamp"] < killed_at
        else:  # re-run (or first run) by the resumed process
            assert r["timestamp"] > killed_at, r
    assert _latest_step(ckpt) == STEPS
    final_dirs = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step_"))
    assert final_dirs == [f"step_{s}" for s in range(STEPS - KEEP + 1, STEPS + 1)]
    assert all(_is_complete(ckpt / d) for d in final_dirs)
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp_")], "debris of the killed save remains"
    assert json.loads((ckpt / f"step_{STEPS}" / STATE_FILE).read_text())["step"] == STEPS

    # Resumption restored weights, optimizer, sampler and RNG: the result equals an uninterrupted run's.
    assert reference.wait(timeout=300) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    resumed, expected = _weights(run_dir, STEPS), _weights(out / "reference", STEPS)
    assert resumed.keys() == expected.keys()
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max((expected[k] - initial[k]).abs().max().item() for k in expected)
    assert moved > 1e-3, "training did not move the weights: the comparison below would prove nothing"
    for k in expected:
        torch.testing.assert_close(resumed[k], expected[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    ref_records = _train_records(out / "reference")
    for mine, theirs in zip(records, ref_records, strict=True):
        assert mine["reward/mean"] == pytest.approx(theirs["reward/mean"], abs=1e-6), mine["step"]
        assert mine["response_length/mean"] == pytest.approx(theirs["response_length/mean"]), mine["step"]
        # the resumed engine goes on at the checkpoint's weight version, as the uninterrupted one does
        assert mine["weights/version"] == theirs["weights/version"] == mine["step"], mine["step"]

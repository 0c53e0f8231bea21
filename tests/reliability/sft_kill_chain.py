"""`python sft_kill_chain.py MODEL_DIR WORKDIR KILLS SEED`: kill -9 `thermik sft` at random points, resume, compare.

This process imports thermik once and forks every run from it (a fork skips the interpreter's start-up, which on a
shared 2-core machine costs more than the tiny run itself); it does no torch work itself, so each child starts with
clean thread pools. A chain: run, SIGKILL at a random moment once it has logged a few steps beyond its checkpoint
(inside a step, a checkpoint write or the log), check that no checkpoint is partial, fork again; after KILLS kills,
run to the end. Printed (JSON): the kills, the corrupt checkpoints seen, the steps logged, and whether the final
weights and per-step losses equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["THERMIK_AUTO_PRECISION"] = "float32"  # float32: resume is bit-exact (kill_suite.py says why)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from kill_suite import corrupt_checkpoints, latest_step

from thermik.cli import main

STEPS, EVERY = 30, 2


def sft_args(model: Path, out: Path, name: str) -> list[str]:
    return [
        "sft", "--name", name, "--output_dir", str(out), "--model.path", str(model),
        "--train_path", str(out / "sft.jsonl"), "--max_steps", str(STEPS), "--batch_size", "3",
        "--max_length", "96", "--eval_every", "0", "--checkpoint.every", str(EVERY), "--checkpoint.keep", "2",
        "--optimizer.warmup_steps", "5", "--progress", "false",
    ]  # fmt: skip


def start(args: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: one `thermik sft`, its output discarded
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        code = 1
        try:
            code = main(args)
        finally:
            os._exit(code or 0)
    return pid


def logged_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line)["step"] for line in lines if line.endswith("}")]
    return max(steps, default=0)


def kill_once(model: Path, out: Path, name: str, rng: random.Random) -> dict | None:
    """Start the run, kill it a random moment after it logs 1-4 steps past its checkpoint; None if it finished."""
    base = latest_step(out / name / "checkpoints")
    target = min(base + rng.randint(1, 4), STEPS)
    pid = start(sft_args(model, out, name))
    while logged_step(out / name) < target:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"{name}: thermik sft exited with {os.waitstatus_to_exitcode(status)}")
            return None
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.2))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return {"resumed_from": base, "killed_after_step": logged_step(out / name), "killed": killed}


def run_to_end(model: Path, out: Path, name: str) -> None:
    _, status = os.waitpid(start(sft_args(model, out, name)), 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name}: thermik sft exited with {os.waitstatus_to_exitcode(status)}")


def compare(out: Path, name: str, reference: str) -> dict:
    import torch
    from safetensors.torch import load_file

    from thermik.monitor.metrics import read_metrics

    def weights(run: str) -> dict[str, torch.Tensor]:
        return {k: v for f in (out / run / "model").glob("*.safetensors") for k, v in load_file(str(f)).items()}

    def losses(run: str) -> list[tuple[int, float]]:
        return [(r["step"], r["sft/loss"]) for r in read_metrics(out / run) if "sft/loss" in r]

    a, b = weights(name), weights(reference)
    return {
        "steps_logged": [s for s, _ in losses(name)],
        "losses_equal": losses(name) == losses(reference),
        "weights_identical": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b),
        "weights_max_abs_diff": max((float((a[k] - b[k]).abs().max()) for k in b if k in a), default=None),
    }


def write_data(out: Path) -> None:
    from thermik.tasks.synthesize import synthesize

    _, sft_path = synthesize("reverse_text", 48, out / "data", split="train", seed=0)
    (out / "sft.jsonl").write_text(Path(sft_path).read_text())


def run(model: Path, out: Path, kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    write_data(out)
    t0 = time.perf_counter()
    run_to_end(model, out, "reference")
    done: list[dict] = []
    corrupt: list[str] = []
    while len(done) < kills:
        kill = kill_once(model, out, "killed", rng)
        if kill is None:  # the run reached its end before this kill: too few steps for the kills asked
            break
        done.append(kill)
        corrupt += corrupt_checkpoints(out / "killed" / "checkpoints")
    run_to_end(model, out, "killed")
    figures = {"kills": len([k for k in done if k["killed"]]), "kill_points": done, "corrupt_checkpoints": corrupt}
    return figures | compare(out, "killed", "reference") | {"seconds": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":
    model_dir, workdir, n, seed_ = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(run(model_dir, workdir, n, seed_)))

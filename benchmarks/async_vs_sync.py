"""Synchronous against asynchronous GRPO on the calculator example, same samples, one process.

Runs `thermik rl @ examples/calculator/rl.toml` (the main job's RL half, from its SFT checkpoint) with
trainer.max_async_steps = 0 (synchronous), then each value of --off-policy, for --steps steps each, with
the calculator MCP server sleeping --latency seconds per tool call (real agent tools are slow: search APIs,
code execution). Prints the mean wall time per step (after the first) and the held-out success after training
(--eval-size problems sampled at temperature 1), and the speed ratio of each async run over the synchronous.

With --split K it adds a row for the same run with max_async_steps = K as three processes from one config
(`thermik inference`, `thermik trainer`, `thermik orchestrator`; docs/process_split.md), each with one torch
thread: the decode loop, the update and the agent loops no longer share one interpreter (its lock) or one
OpenMP runtime. Its s/step is the mean interval between the trainer's steps (after the first).

    bash examples/calculator/run.sh                      # once: builds runs/calculator-sft/model
    python benchmarks/async_vs_sync.py --latency 0.3 --steps 30
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from thermik.config.loader import dump_toml, load_config
from thermik.config.schema import RunConfig
from thermik.runs.local import run_rl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "calculator" / "rl.toml"


def rl_argv(args: argparse.Namespace, name: str, off_policy: int, out: Path) -> list[str]:
    return [
        "@",
        str(EXAMPLE),
        f"--name={name}",
        f"--output_dir={out}",
        f"--model.path={args.model}",
        f"--trainer.steps={args.steps}",
        f"--trainer.max_async_steps={off_policy}",
        f"--env.tool_latency_s={args.latency}",
        f"--eval.size={args.eval_size}",
        "--eval.before=false",
        "--checkpoint.every=0",
        "--monitor.progress=false",
        "--monitor.save_trajectories_every=0",
    ]


def run(args: argparse.Namespace, off_policy: int, out: Path) -> dict[str, float]:
    cfg = load_config(RunConfig, rl_argv(args, f"async-{off_policy}", off_policy, out), env={})
    result = run_rl(cfg)
    records = _records(cfg.run_dir / "metrics.jsonl")
    steps = [r["time/step"] for r in records if "time/step" in r][1:]
    return _summary(statistics.mean(steps), result["after"]["success"], records)


def run_split(args: argparse.Namespace, off_policy: int, out: Path) -> dict[str, float]:
    """The same run as three processes started from one config, one torch thread each."""
    port = _free_port()
    argv = rl_argv(args, f"split-{off_policy}", off_policy, out)
    argv += [f"--inference.base_url=http://127.0.0.1:{port}", f"--server.port={port}", "--split.poll_interval_s=0.02"]
    cfg = load_config(RunConfig, argv, env={})
    config = out / f"split-{off_policy}.toml"
    config.write_text(dump_toml(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "thermik.cli"]
    logs = {name: (out / f"split-{off_policy}-{name}.log").open("wb") for name in ("inference", "trainer", "orch")}
    server = subprocess.Popen([*command, "inference", "@", str(config)], env=env, stdout=logs["inference"], stderr=-2)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", server)
        sides = [
            subprocess.Popen([*command, name, "@", str(config)], env=env, stdout=logs[log], stderr=-2)
            for name, log in (("trainer", "trainer"), ("orchestrator", "orch"))
        ]
        for proc in sides:
            if proc.wait() != 0:
                raise RuntimeError(f"split run failed: see the logs in {out}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    trained = [r["timestamp"] for r in _records(cfg.run_dir / "trainer" / "metrics.jsonl") if "policy/loss" in r]
    intervals = [b - a for a, b in itertools.pairwise(trained[1:])]  # after the first step
    success = json.loads((cfg.run_dir / "eval_after.json").read_text())["success"]
    return _summary(statistics.mean(intervals), success, _records(cfg.run_dir / "orchestrator" / "metrics.jsonl"))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _summary(step_s: float, success: float, records: list[dict]) -> dict[str, float]:
    stale = [r["off_policy/staleness_mean"] for r in records if "off_policy/staleness_mean" in r]
    return {
        "step_s": step_s,
        "success": success,
        "reward": float(statistics.mean(r["reward/mean"] for r in records if "reward/mean" in r)),
        "staleness": statistics.mean(stale) if stale else 0.0,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"thermik inference did not come up at {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/calculator-sft/model", help="the SFT checkpoint to start from")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds the MCP server sleeps per tool call")
    parser.add_argument("--off-policy", type=int, nargs="+", default=[1, 2], help="max_async_steps values")
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--split", type=int, nargs="*", default=[], help="max_async_steps of split-process rows")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        parser.error(f"--model {args.model} is not a model directory; run `bash examples/calculator/run.sh` first")
    if args.steps < 3 or any(k < 1 for k in args.off_policy) or any(k < 0 for k in args.split):
        parser.error("--steps must be >= 3, every --off-policy value >= 1 and every --split value >= 0")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        names = {k: f"max_async_steps={k}" if k else "synchronous" for k in [0, *args.off_policy]}
        results = {name: run(args, k, out) for k, name in names.items()}
        results |= {f"split processes, k={k}": run_split(args, k, out) for k in args.split}
    base = results["synchronous"]["step_s"]
    print(f"calculator, {args.steps} steps of 12 x 8 samples, tool latency {args.latency} s per call")
    print(f"{'mode':<26}{'s/step':>8}{'speed-up':>10}{'train reward':>14}{'held-out success':>18}{'staleness':>11}")
    for mode, r in results.items():
        print(
            f"{mode:<26}{r['step_s']:>8.2f}{base / r['step_s']:>9.2f}x{r['reward']:>14.3f}"
            f"{r['success']:>18.3f}{r['staleness']:>11.2f}"
        )


if __name__ == "__main__":
    main()

"""Synchronous against asynchronous GRPO on the calculator example, same samples, one process.

Runs `thermik rl @ examples/calculator/rl.toml` (the main job's RL half, from its SFT checkpoint) with
trainer.max_async_steps = 0 (synchronous), then each value of --off-policy, for --steps steps each, with
the calculator MCP server sleeping --latency seconds per tool call (real agent tools are slow: search APIs,
code execution). Asynchronous rows take weight updates in flight (docs/async.md), one row per --inflight-kv
value (the running requests' KV cache kept or recomputed at an update). Every mode runs --seeds times (seeds
0, 1, ...); it prints the mean ± standard error over seeds of the wall time per step (after the first) and of
the held-out success after training (--eval-size problems sampled at temperature 1), the speed ratio over the
synchronous mean, the staleness in versions (per group, mean and max) and per sampled token, and the share of
samples the staleness rule dropped.

With --split K it adds a row for the same run with max_async_steps = K as three processes from one config
(`thermik inference`, `thermik trainer`, `thermik orchestrator`; docs/process_split.md), each with one torch
thread: the decode loop, the update and the agent loops no longer share one interpreter (its lock) or one
OpenMP runtime. Its s/step is the mean interval between the trainer's steps (after the first).

    bash examples/calculator/run.sh                      # once: builds runs/calculator-sft/model
    python benchmarks/async_vs_sync.py --latency 0.3 --steps 30 --seeds 3 --inflight-kv keep recompute
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


def rl_argv(args: argparse.Namespace, name: str, off_policy: int, out: Path, seed: int = 0, kv: str = "keep"):
    return [
        "@",
        str(EXAMPLE),
        f"--name={name}",
        f"--output_dir={out}",
        f"--model.path={args.model}",
        f"--trainer.steps={args.steps}",
        f"--trainer.max_async_steps={off_policy}",
        f"--seed={seed}",
        f"--inference.inflight_kv={kv}",
        f"--env.tool_latency_s={args.latency}",
        f"--eval.size={args.eval_size}",
        "--eval.before=false",
        "--checkpoint.every=0",
        "--monitor.progress=false",
        "--monitor.save_trajectories_every=0",
    ]


def run(args: argparse.Namespace, off_policy: int, out: Path, seed: int, kv: str) -> dict[str, float]:
    cfg = load_config(
        RunConfig, rl_argv(args, f"async-{off_policy}-{kv}-seed{seed}", off_policy, out, seed, kv), env={}
    )
    result = run_rl(cfg)
    records = _records(cfg.run_dir / "metrics.jsonl")
    steps = [r["time/step"] for r in records if "time/step" in r][1:]
    return _summary(statistics.mean(steps), result["after"]["success"], records)


def run_split(args: argparse.Namespace, off_policy: int, out: Path, seed: int) -> dict[str, float]:
    """The same run as three processes started from one config, one torch thread each."""
    port = _free_port()
    argv = rl_argv(args, f"split-{off_policy}-seed{seed}", off_policy, out, seed)
    argv += [f"--inference.base_url=http://127.0.0.1:{port}", f"--server.port={port}"]  # notified, not polled
    cfg = load_config(RunConfig, argv, env={})
    config = out / f"split-{off_policy}-seed{seed}.toml"
    config.write_text(dump_toml(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "thermik.cli"]
    logs = {
        name: (out / f"split-{off_policy}-{seed}-{name}.log").open("wb") for name in ("inference", "trainer", "orch")
    }
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
    def mean(key: str) -> float:
        values = [r[key] for r in records if key in r]
        return statistics.mean(values) if values else 0.0

    def most(key: str) -> float:
        return max((r[key] for r in records if key in r), default=0.0)

    def step_mean(*keys: str) -> float:  # per step after the first, the keys summed
        steps = [r for r in records if "time/step" in r][1:]
        return statistics.mean(sum(r.get(k, 0.0) for k in keys) for r in steps) if steps else 0.0

    dropped = sum(r.get("async/dropped_samples", 0.0) for r in records)
    trained = most("progress/samples")
    return {
        "step_s": step_s,
        "rollout_s": step_mean("time/generate"),
        "train_s": step_mean("time/train", "time/weight_sync"),
        "cpu_s": step_mean("time/generate_cpu", "time/train_cpu", "time/weight_sync"),  # synchronous runs only
        "success": success,
        "reward": mean("reward/mean"),
        "staleness": mean("off_policy/staleness_mean"),
        "staleness_max": most("off_policy/staleness_max"),
        "token_staleness": mean("off_policy/token_staleness_mean"),
        "versions_per_sample": most("off_policy/versions_per_sample_max"),
        "dropped": dropped / (dropped + trained) if dropped + trained else 0.0,
    }


def over_seeds(runs: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """(mean, standard error) of every summary value over the seeds' runs (s.e. 0 for one run)."""
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        out[key] = (statistics.mean(values), se)
    return out


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
    parser.add_argument("--seeds", type=int, default=3, help="runs per mode (seeds 0, 1, ...)")
    parser.add_argument(
        "--inflight-kv", nargs="+", default=["keep"], choices=["keep", "recompute"],
        help="inference.inflight_kv of the async rows (one row each)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        parser.error(f"--model {args.model} is not a model directory; run `bash examples/calculator/run.sh` first")
    if args.steps < 2 or args.seeds < 1 or any(k < 1 for k in args.off_policy) or any(k < 0 for k in args.split):
        parser.error("--steps must be >= 2, --seeds >= 1, every --off-policy value >= 1 and every --split value >= 0")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        seeds = range(args.seeds)
        modes = {"synchronous": lambda seed: run(args, 0, out, seed, "keep")}
        for k, kv in itertools.product(args.off_policy, args.inflight_kv):
            modes[f"k={k}, in-flight, kv {kv}"] = lambda seed, k=k, kv=kv: run(args, k, out, seed, kv)
        for k in args.split:
            modes[f"split processes, k={k}"] = lambda seed, k=k: run_split(args, k, out, seed)
        results = {name: over_seeds([mode(seed) for seed in seeds]) for name, mode in modes.items()}
    print_table(args, results)


def print_table(args: argparse.Namespace, results: dict[str, dict[str, tuple[float, float]]]) -> None:
    base = results["synchronous"]["step_s"][0]
    print(
        f"calculator, {args.steps} steps of 12 x 8 samples, tool latency {args.latency} s per call, "
        f"{args.seeds} seed(s) per mode: mean ± s.e."
    )
    head = ("mode", "s/step", "speed-up", "held-out success", "stale mean/max", "token stale", "versions", "dropped")
    print(f"{head[0]:<30}{head[1]:>14}{head[2]:>10}{head[3]:>19}{head[4]:>16}{head[5]:>13}{head[6]:>10}{head[7]:>9}")
    for mode, r in results.items():
        (step, step_se), (success, success_se) = r["step_s"], r["success"]
        print(
            f"{mode:<30}{step:>7.2f} ± {step_se:<4.2f}{base / step:>9.2f}x{success:>11.3f} ± {success_se:<5.3f}"
            f"{r['staleness'][0]:>10.2f}/{r['staleness_max'][0]:<5.0f}{r['token_staleness'][0]:>13.2f}"
            f"{r['versions_per_sample'][0]:>10.0f}{r['dropped'][0]:>9.1%}"
        )
    print_overlap_bound(results)


def print_overlap_bound(results: dict[str, dict[str, tuple[float, float]]]) -> None:
    """The synchronous run's halves, each measured alone (nothing overlaps them): a step that overlaps them perfectly,
    with no contention for the cores, takes max(rollout, train + weight sync). On this machine's cores the halves
    also cannot finish before the cores have done their CPU work: the shared-cores bound is the larger of that and
    the CPU seconds of a synchronous step (both halves, all threads) over the cores. How close each async row comes."""
    sync = results["synchronous"]
    rollout, train, cpu = sync["rollout_s"][0], sync["train_s"][0], sync["cpu_s"][0]
    cores = len(os.sched_getaffinity(0))
    bound = max(rollout, train)
    shared = max(bound, cpu / cores)
    print(
        f"overlap bound (synchronous run, per step, measured alone): rollout {rollout:.2f} s, train + weight sync "
        f"{train:.2f} s, max {bound:.2f} s (sum {rollout + train:.2f} s; speed-up at the bound "
        f"{sync['step_s'][0] / bound:.2f}x)"
    )
    print(
        f"shared-cores bound: {cpu:.2f} CPU s per synchronous step over {cores} cores = {cpu / cores:.2f} s, so "
        f"max {shared:.2f} s (speed-up at the bound {sync['step_s'][0] / shared:.2f}x)"
    )
    for mode, r in results.items():
        if mode != "synchronous":
            step = r["step_s"][0]
            print(
                f"  {mode}: {step:.2f} s/step = {bound / step:.1%} of the overlap bound, {shared / step:.1%} of the "
                "shared-cores bound"
            )


if __name__ == "__main__":
    main()

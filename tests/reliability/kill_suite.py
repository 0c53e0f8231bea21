"""kill -9 of `thermik rl` at random moments (generation, update, checkpoint write, MCP call), then resume.

A chain: the same run is started through `kill_hook.py`, killed at a chosen moment, started again (and killed
again), ..., and finally run to the end. After every kill: no checkpoint directory is partial, `latest` names a
complete one, no MCP server outlived the run. At the end: every step logged once, metrics, sampler order and final
weights equal an uninterrupted run of the same seeded config.

`python tests/reliability/kill_suite.py --kills 20 --fuzz-cases 10000` prints the figures (docs/reliability.md
quotes them); tests/reliability/test_kill9.py runs a bounded form.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
PHASES = ("generation", "update", "checkpoint", "mcp")
MAX_DELAY_S = {"generation": 0.3, "update": 0.15, "checkpoint": 0.03, "mcp": 0.005}
STEPS, PROMPTS, GROUP = 5, 2, 2
CHAIN = 5  # kills per run directory; more would exhaust its steps


def write_data(out: Path) -> None:
    """reverse_text prompts (the echo env ignores their ground truth)."""
    from thermik.data.dataset import write_rows
    from thermik.tasks.registry import generate_rows

    write_rows(out / "train.jsonl", generate_rows("reverse_text", 64, 0, split="train"))
    write_rows(out / "eval.jsonl", generate_rows("reverse_text", 2, 0, split="eval"))


# The Ray mode: one trainer worker and one engine actor on a local Ray (started by each `thermik rl` and taken down
# with it when it is killed).
RAY_ARGS = ["--distributed.enabled", "true", "--distributed.num_trainers", "1", "--distributed.num_engines", "1",
            "--distributed.cpus_per_actor", "0.5"]  # fmt: skip


def rl_args(model: Path, out: Path, name: str, ray: bool = False) -> list[str]:
    return [
        "rl", *(RAY_ARGS if ray else []), "--name", name, "--output_dir", str(out), "--model.path", str(model),
        "--env.name", "echo_env:EchoEnv", "--env.max_turns", "1",
        "--trainer.steps", str(STEPS), "--trainer.prompts_per_step", str(PROMPTS), "--trainer.group_size", str(GROUP),
        "--rollout.max_generate_length", "12", "--algorithm.entropy_coef", "0.01",
        "--data.train_path", str(out / "train.jsonl"), "--data.eval_path", str(out / "eval.jsonl"),
        "--eval.before", "false", "--eval.size", "2", "--checkpoint.every", "1", "--checkpoint.keep", "2",
        "--monitor.progress", "false", "--monitor.save_trajectories_every", "0",
    ]  # fmt: skip


def _env(marker: Path) -> dict[str, str]:
    """The runs' environment. float32 everywhere: a resumed run equals an uninterrupted one bit for bit in float32; a
    bfloat16 run (the default on a bf16 CPU) resumed after kills was measured 9e-4 away in the weights."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("THERMIK_")}
    env["THERMIK_AUTO_PRECISION"] = "float32"
    # src for thermik, tests/ for fixtures.faulty_server (echo_env's MCP server)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("RAY_AUTH_MODE", "disabled")  # a local Ray in the Ray mode
    return env | {"RELIABILITY_MARKER": str(marker), "TOKENIZERS_PARALLELISM": "false"}


def run_hooked(
    args: list[str], spec: dict[str, Any], marker: Path, timeout: float = 300
) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(HERE / "kill_hook.py"), json.dumps(spec), *args]
    return subprocess.run(argv, env=_env(marker), capture_output=True, text=True, timeout=timeout, check=False)


def latest_step(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text().strip().removeprefix("step_"))
    except (FileNotFoundError, ValueError):
        return 0


def corrupt_checkpoints(ckpt: Path) -> list[str]:
    """Step directories that are not complete, and a `latest` naming a missing one."""
    from thermik.training.checkpoint import MODEL_DIR, OPTIMIZER_FILE, STATE_FILE

    if not ckpt.is_dir():
        return []
    bad = []
    for d in ckpt.iterdir():
        if d.name.startswith("step_"):
            files = [d / OPTIMIZER_FILE, d / STATE_FILE, d / "rng.pt"]
            if not (all(f.is_file() for f in files) and any((d / MODEL_DIR).glob("*.safetensors"))):
                bad.append(d.name)
            else:
                json.loads((d / STATE_FILE).read_text())  # parses
    if (ckpt / "latest").is_file() and not (ckpt / (ckpt / "latest").read_text().strip()).is_dir():
        bad.append("latest -> missing")
    return bad


def leaked_servers(marker: Path, wait_s: float = 3.0) -> int:
    """Processes whose command line names `marker` (the run's MCP servers), after `wait_s` for them to exit."""
    deadline = time.monotonic() + wait_s
    while True:
        found = 0
        for proc in Path("/proc").iterdir():
            try:
                found += proc.name.isdigit() and str(marker).encode() in (proc / "cmdline").read_bytes()
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _kill_plan(rng: random.Random, phase: str, remaining: int) -> dict[str, Any]:
    per_step = PROMPTS * GROUP if phase == "mcp" else 1
    occurrence = rng.randint(1, max(1, min(2, remaining)) * per_step)
    return {"phase": phase, "occurrence": occurrence, "delay_s": rng.uniform(0, MAX_DELAY_S[phase])}


def kill_chain(
    model: Path, out: Path, name: str, phases: list[str], rng: random.Random, ray: bool = False
) -> dict[str, Any]:
    """Kill the run once per entry of `phases`, checking what each kill left; then run it to the end."""
    ckpt, log = out / name / "checkpoints", out / f"{name}.log"
    log.mkdir(parents=True, exist_ok=True)
    marker = out / f"{name}.marker"
    figures: dict[str, Any] = {"kills": [], "not_killed": 0, "corrupt": [], "leaked": 0}
    for phase in phases:
        remaining = STEPS - latest_step(ckpt)
        if remaining <= 0:
            break
        proc = run_hooked(
            rl_args(model, out, name, ray), {"log": str(log), **_kill_plan(rng, phase, remaining)}, marker
        )
        if proc.returncode != -9:
            figures["not_killed"] += 1
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: thermik rl failed with {proc.returncode}:\n{proc.stderr[-3000:]}")
            continue
        figures["kills"].append(json.loads((log / "kills.jsonl").read_text().splitlines()[-1]) | {"resume": remaining})
        figures["corrupt"] += corrupt_checkpoints(ckpt)
        figures["leaked"] += leaked_servers(marker)
    final = run_hooked(rl_args(model, out, name, ray), {"log": str(log)}, marker)
    if final.returncode != 0:
        raise RuntimeError(f"{name}: the resumed run failed with {final.returncode}:\n{final.stderr[-3000:]}")
    figures["leaked"] += leaked_servers(marker)
    return figures


def _order(log: Path) -> dict[int, list[str]]:
    """The prompts of each step, as the last process that ran the step sampled them."""
    order: dict[int, list[str]] = {}
    for line in (log / "order.jsonl").read_text().splitlines():
        record = json.loads(line)
        order[record["step"]] = record["prompts"]
    return order


def compare(out: Path, name: str, reference: str) -> dict[str, Any]:
    """Steps logged, metrics, sampler order and final weights of `name` against the uninterrupted `reference`."""
    import torch
    from safetensors.torch import load_file

    from thermik.monitor.metrics import read_metrics

    def records(run: str) -> list[dict]:
        return [r for r in read_metrics(out / run) if "time/step" in r]

    def weights(run: str) -> dict[str, torch.Tensor]:
        files = (out / run / "checkpoints" / f"step_{STEPS}" / "model").glob("*.safetensors")
        return {k: v for f in files for k, v in load_file(str(f)).items()}

    mine, theirs = records(name), records(reference)
    keys = ("reward/mean", "response_length/mean", "policy/loss", "policy/grad_norm")
    metric_diffs = [abs(a[k] - b[k]) for a, b in zip(mine, theirs, strict=False) for k in keys if k in a and k in b]
    got, want = _order(out / f"{name}.log"), _order(out / f"{reference}.log")
    seen = [p for s in sorted(got) for p in got[s]]
    expected = [p for s in sorted(want) for p in want[s]]
    a, b = weights(name), weights(reference)
    return {
        "steps_logged": [r["step"] for r in mine],
        "metrics_max_abs_diff": max(metric_diffs, default=float("nan")),
        "samples_lost": len(set(expected) - set(seen)),
        "samples_repeated": len(seen) - len(set(seen)),
        "order_equal": got == want,
        "weights_max_abs_diff": max(float((a[k] - b[k]).abs().max()) for k in b) if a.keys() == b.keys() else None,
        "weights_identical": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b),
    }


def run_suite(model: Path, workdir: Path, kills: int, seed: int = 0, ray: bool = False) -> dict[str, Any]:
    """`kills` kills over chains of CHAIN kills (phases in turn, random moments); returns the figures. ray: every
    run (the reference too) in the Ray mode."""
    rng = random.Random(seed)
    write_data(workdir)
    t0 = time.perf_counter()
    (workdir / "reference.log").mkdir()
    reference = run_hooked(rl_args(model, workdir, "reference", ray), {"log": str(workdir / "reference.log")},
                           workdir / "reference.marker")  # fmt: skip
    if reference.returncode != 0:
        raise RuntimeError(f"the reference run failed:\n{reference.stderr[-3000:]}")
    chains: list[dict[str, Any]] = []
    kills_done: list[dict[str, Any]] = []
    while len(kills_done) < kills and len(chains) < kills // CHAIN + 3:  # a chain ends early once its run is done
        first = len(kills_done)
        phases = [PHASES[i % len(PHASES)] for i in range(first, min(kills, first + CHAIN))]
        name = f"killed{len(chains)}"
        chains.append(kill_chain(model, workdir, name, phases, rng, ray) | compare(workdir, name, "reference"))
        kills_done += chains[-1]["kills"]
    return {
        "kills": len(kills_done),
        "kills_by_phase": {p: sum(k["phase"] == p for k in kills_done) for p in (*PHASES, "between")},
        "resumed_runs_matching": sum(ch["weights_max_abs_diff"] is not None and ch["order_equal"] for ch in chains),
        "chains": len(chains),
        "corrupt_checkpoints": sum(len(ch["corrupt"]) for ch in chains),
        "samples_lost": sum(ch["samples_lost"] for ch in chains),
        "samples_repeated": sum(ch["samples_repeated"] for ch in chains),
        "leaked_mcp_servers": sum(ch["leaked"] for ch in chains),
        "weights_max_abs_diff": max(ch["weights_max_abs_diff"] or 0.0 for ch in chains),
        "weights_identical_chains": sum(ch["weights_identical"] for ch in chains),
        "metrics_max_abs_diff": max(ch["metrics_max_abs_diff"] for ch in chains),
        "steps_logged_ok": all(ch["steps_logged"] == list(range(1, STEPS + 1)) for ch in chains),
        "not_killed": sum(ch["not_killed"] for ch in chains),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ray", action="store_true", help="run every `thermik rl` in the Ray mode")
    parser.add_argument("--model", type=Path, help="a model directory (default: a fresh qwen2-1m)")
    parser.add_argument("--fuzz-cases", type=int, default=0, help="also fuzz each tool-call parser with N strings")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    if args.fuzz_cases:
        from test_fuzz_parsers import run_fuzz

        from thermik.tools.parsers import TOOL_PARSERS

        print(json.dumps({name: run_fuzz(name, args.fuzz_cases) for name in sorted(TOOL_PARSERS)}, indent=2))
    if not args.kills:
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True)
            tmp = str(args.workdir)
        model = args.model
        if model is None:
            from thermik.models.presets import init_model

            model = init_model("qwen2-1m", Path(tmp) / "qwen2-1m", seed=0)
        print(json.dumps(run_suite(model, Path(tmp), args.kills, args.seed, args.ray), indent=2))


if __name__ == "__main__":
    main()

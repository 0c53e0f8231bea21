"""One GRPO step of the real-model example in float32 against bfloat16, same samples shape, one command.

Runs the SmolLM2 example's RL half (`examples/smollm2_word_problems/rl.toml`: 8 prompts x 8 samples, word problems
through the MCP calculator, full fine-tune) for --steps steps in each precision:

- float32: the engine's weights and KV cache in float32 (`inference.precision = "float32"`) and the trainer in
  float32 (`model.train_precision = "float32"`), on this checkout's code;
- bf16: the engine in bfloat16 and the trainer in bf16-mixed (float32 master weights), the example's setting; left
  out on a CPU whose bfloat16 ops do not run (`THERMIK_CPU_ISA=avx2` simulates one), where ratios are to float32.

`--before REV` adds a third run first: the float32 step as thermik's code at git revision REV ran it (its source is
exported from git into a temporary directory and run with the same config, flags, data and checkpoint). The
earliest revision that runs this example is eeb00c9: its bf16 engine and trainer exist, and in float32 it runs
the code paths from before the CPU speed work (kernels, packing, fused sampler and optimizer), which float32 shares
today. That run turns off the weight-checksum guard, which that step did not have; the inverse-CDF sampler and the
entropy from the computed log-softmax already make its float32 step faster than older code, so it is a
conservative baseline.

The runs alternate --rounds times (so background load hits them alike), each in a process of its own (no run
inherits another's heap). Each run starts from the same checkpoint and seed. Prints the mean step time after the
first step of each run, split into generation and training, and the ratios to the last setting run (bf16, or float32
where bf16 is left out).

    bash examples/smollm2_word_problems/run.sh          # once: builds runs/smollm2-sft/model
    python benchmarks/rl_step_precision.py --steps 10 --rounds 1 --before eeb00c9 [-- --trainer.group_size=4 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = Path("examples") / "smollm2_word_problems" / "rl.toml"
SETTINGS = {
    "float32": ["--inference.precision=float32", "--model.train_precision=float32"],
    "bf16": ["--inference.precision=bfloat16", "--model.train_precision=bf16-mixed"],
}


def settings() -> list[str]:
    """The settings this CPU runs: bf16 needs bfloat16 ops (thermik.cpu.isa; the config refuses it elsewhere)."""
    from thermik.cpu.isa import capabilities

    return [name for name in SETTINGS if name != "bf16" or capabilities().bf16_runs]


KEYS = ("time/step", "time/generate", "time/train")
# Each run is a process of its own (no run inherits another's heap), with its revision's thermik first on sys.path.
RUN = "import sys; from thermik.config.loader import load_config; from thermik.config.schema import RunConfig; "
RUN += "from thermik.runs.local import run_rl; run_rl(load_config(RunConfig, sys.argv[1:], env={}))"


def export_revision(revision: str, into: Path) -> Path:
    """The source tree of `revision` (src/ and the example) under `into`, from this checkout's git history."""
    archive = into / "source.tar"
    try:
        subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), revision, "src", "examples"],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        sys.exit(f"--before {revision}: git archive failed ({exc.stderr.strip()}); pass a revision of this checkout")
    tree = into / f"thermik-{revision}"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_once(args: argparse.Namespace, name: str, out: Path, old_tree: Path | None = None) -> dict[str, float]:
    """Mean of each timing key over the steps after the first, run in a subprocess on this checkout's thermik or on
    `old_tree`'s (an exported revision)."""
    example = (old_tree or REPO) / EXAMPLE
    argv = ["@", str(example), f"--name={name}", f"--output_dir={out}", f"--model.path={args.model}"]
    argv += [f"--data.train_path={args.data}"] if args.data else []
    argv += [f"--trainer.steps={args.steps}", "--eval.before=false"]
    argv += ["--eval.size=1", "--checkpoint.every=0", "--monitor.progress=false", "--monitor.save_trajectories_every=0"]
    argv += [*args.overrides, *SETTINGS[name.split("-")[0]]]
    if old_tree is not None:
        argv.append("--guards.weight_checksum=false")  # the step at the filing had no checksum guard
    env = {**os.environ, "PYTHONPATH": str((old_tree or REPO) / "src")}
    subprocess.run([sys.executable, "-c", RUN, *argv], check=True, env=env, cwd=REPO)
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r][1:]
    return {key: statistics.mean(r[key] for r in steps) for key in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/smollm2-sft/model", help="the SFT checkpoint RL starts from")
    parser.add_argument("--data", default="runs/smollm2-data/rows.jsonl", help="the example's training rows")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per run (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", metavar="REV", help="also run the float32 step of git revision REV (eeb00c9)")
    parser.add_argument("overrides", nargs="*", help="more config flags for every run, e.g. --trainer.group_size=4")
    args = parser.parse_args()
    args.model, args.data = (str(Path(p).resolve()) for p in (args.model, args.data))
    names = ([f"float32@{args.before}"] if args.before else []) + settings()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = export_revision(args.before, Path(tmp)) if args.before else None
        for r in range(args.rounds):
            for name in names:
                tree = old_tree if "@" in name else None
                results[name].append(run_once(args, f"{name.replace('@', '-at-')}-{r}", Path(tmp), tree))
    print(f"\nGRPO step, {EXAMPLE.parent.name} shape, mean over steps 2..{args.steps} of {args.rounds} round(s):")
    print(f"  {'run':<18}" + "".join(f"{key:>16}" for key in KEYS))
    means = {name: {k: statistics.mean(r[k] for r in rs) for k in KEYS} for name, rs in results.items()}
    for name, m in means.items():
        print(f"  {name:<18}" + "".join(f"{m[k]:>15.2f}s" for k in KEYS))
    reference = names[-1]
    for name in names[:-1]:
        ratios = "".join(f"{means[name][k] / means[reference][k]:>15.2f}x" for k in KEYS)
        print(f"  {name + ' / ' + reference:<18}{ratios}")


if __name__ == "__main__":
    main()

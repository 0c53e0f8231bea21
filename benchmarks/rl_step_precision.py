"""One GRPO step of the real-model example in float32 against bfloat16, same samples shape, one process.

Runs the SmolLM2 example's RL half (`examples/smollm2_word_problems/rl.toml`: 8 prompts x 8 samples, word problems
through the MCP calculator, full fine-tune) for --steps steps in each precision:

- float32: the engine's weights and KV cache in float32 (`inference.precision = "float32"`) and the trainer in
  float32 (`model.train_precision = "float32"`): what thermik did before bf16 existed;
- bf16: the engine in bfloat16 and the trainer in bf16-mixed (float32 master weights), the example's setting.

The two alternate --rounds times (so background load hits both alike). Each run starts from the same checkpoint
and seed. Prints the mean step time after the first step of each run, split into generation and training, and the
ratio float32 / bf16.

    bash examples/smollm2_word_problems/run.sh          # once: builds runs/smollm2-sft/model
    python benchmarks/rl_step_precision.py --steps 4 --rounds 1 [-- --trainer.group_size=4 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from thermik.config.loader import load_config
from thermik.config.schema import RunConfig
from thermik.runs.local import run_rl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2_word_problems" / "rl.toml"
SETTINGS = {
    "float32": ["--inference.precision=float32", "--model.train_precision=float32"],
    "bf16": ["--inference.precision=bfloat16", "--model.train_precision=bf16-mixed"],
}
KEYS = ("time/step", "time/generate", "time/train")


def run_once(args: argparse.Namespace, name: str, out: Path) -> dict[str, float]:
    """Mean of each timing key over the steps after the first."""
    argv = ["@", str(EXAMPLE), f"--name={name}", f"--output_dir={out}", f"--model.path={args.model}"]
    argv += [f"--trainer.steps={args.steps}", "--eval.before=false", "--eval.size=1", "--checkpoint.every=0"]
    argv += ["--monitor.progress=false", "--monitor.save_trajectories_every=0", *args.overrides]
    argv += SETTINGS[name.split("-")[0]]
    run_rl(load_config(RunConfig, argv, env={}))
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r][1:]
    return {key: statistics.mean(r[key] for r in steps) for key in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/smollm2-sft/model", help="the SFT checkpoint RL starts from")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per run (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="more config flags for both runs, e.g. --trainer.group_size=4")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in SETTINGS:
                results[name].append(run_once(args, f"{name}-{r}", Path(tmp)))
    print(f"\nGRPO step, {EXAMPLE.parent.name} shape, mean over steps 2..{args.steps} of {args.rounds} round(s):")
    print(f"  {'precision':<10}" + "".join(f"{key:>16}" for key in KEYS))
    means = {name: {k: statistics.mean(r[k] for r in rs) for k in KEYS} for name, rs in results.items()}
    for name, m in means.items():
        print(f"  {name:<10}" + "".join(f"{m[k]:>15.2f}s" for k in KEYS))
    ratios = "".join(f"{means['float32'][k] / means['bf16'][k]:>15.2f}x" for k in KEYS)
    print(f"  {'f32/bf16':<10}{ratios}")


if __name__ == "__main__":
    main()

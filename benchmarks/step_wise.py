"""The cost of step-wise trajectories (rollout.step_wise = "on-break") in RL step time, calculator example, one process.

With step-wise trajectories the agent loop renders the whole conversation through the chat template after every
turn and compares it with the text of the tokens so far (`models/chat/history.py`); without a break it then appends the
same observation tokens as the loop without step-wise did. The baseline is that loop: the next prompt is the
observation delta alone (`ChatTokenizer.encode_observations`, no rendering of the history, no comparison).

Both run in this process on one run of `examples/calculator/rl.toml` (its SFT checkpoint, or with --model a preset
built from scratch), alternating step by step so load and weights hit them alike. Prints the mean step time of each
(steps after the first two), their ratio, the time spent rendering and comparing per step (measured inside the
loop), and samples per episode (1.0: no break occurred).

    bash examples/calculator/run.sh                  # once: builds runs/calculator-sft/model
    python benchmarks/step_wise.py --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from thermik.config.loader import load_config
from thermik.config.schema import RunConfig
from thermik.envs.base import Message
from thermik.models.chat import NextPrompt, PromptHistory
from thermik.models.presets import init_model
from thermik.rollout import agent_loop
from thermik.runs.local import LocalMode, setup
from thermik.runs.step import rl_step

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "calculator" / "rl.toml"


class TimedHistory(PromptHistory):
    """The step-wise loop's history, with the time spent rendering and comparing added up."""

    seconds = 0.0

    def render_next(self) -> NextPrompt:
        t0 = time.perf_counter()
        out = super().render_next()
        TimedHistory.seconds += time.perf_counter() - t0
        return out


class DeltaHistory(PromptHistory):
    """The loop before step-wise trajectories: the next prompt is the new observations' delta, nothing rendered."""

    def add_sampled(self, ids: list[int], text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def add_observations(self, observations: list[Message]) -> None:
        super().add_observations(observations)
        self._new = list(observations)

    def render_next(self) -> NextPrompt:
        return NextPrompt(self.chat.encode_observations(self._new), True, "")


def config(args: argparse.Namespace, out: Path) -> RunConfig:
    argv = ["@", str(EXAMPLE), "--name=step-wise-bench", f"--output_dir={out}", f"--model.path={args.model}"]
    argv += [f"--trainer.prompts_per_step={args.prompts}", f"--trainer.group_size={args.group_size}"]
    argv += ["--eval.before=false", "--checkpoint.every=0", "--monitor.progress=false"]
    argv += ["--monitor.save_trajectories_every=0", "--rollout.step_wise=on-break"]
    return load_config(RunConfig, argv, env={})


async def measure(args: argparse.Namespace, out: Path) -> dict[str, dict[str, list[float]]]:
    run = setup(config(args, out))
    mode = LocalMode(run)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in ("baseline", "step-wise")}
    try:
        await mode.start()
        step = 0
        for r in range(args.rounds):
            order = ("baseline", "step-wise") if r % 2 == 0 else ("step-wise", "baseline")
            for name in order:
                agent_loop.PromptHistory = DeltaHistory if name == "baseline" else TimedHistory  # type: ignore[misc]
                TimedHistory.seconds = 0.0
                metrics = await rl_step(mode, step)
                step += 1
                row = results[name]
                for key in ("time/step", "time/generate", "time/train", "step_wise/samples_per_episode"):
                    row.setdefault(key, []).append(metrics[key])
                row.setdefault("render", []).append(TimedHistory.seconds)
    finally:
        agent_loop.PromptHistory = PromptHistory  # type: ignore[misc]
        await mode.stop()
        await run.close()
    return results


def report(results: dict[str, dict[str, list[float]]]) -> None:
    def mean(name: str, key: str) -> float:
        return statistics.fmean(results[name][key][1:])  # each variant's first step warms up

    print(f"{'':10s} {'s/step':>8s} {'generate':>9s} {'train':>8s} {'render+compare':>15s} {'samples/episode':>16s}")
    for name in results:
        print(
            f"{name:10s} {mean(name, 'time/step'):8.3f} {mean(name, 'time/generate'):9.3f} "
            f"{mean(name, 'time/train'):8.3f} {mean(name, 'render'):15.4f} "
            f"{mean(name, 'step_wise/samples_per_episode'):16.2f}"
        )
    ratio = mean("step-wise", "time/step") / mean("baseline", "time/step")
    generate = mean("step-wise", "time/generate") / mean("baseline", "time/generate")
    share = mean("step-wise", "render") / mean("step-wise", "time/step")
    print(f"step-wise / baseline: step time {ratio:.3f}, generation (the phase step-wise changes) {generate:.3f}")
    print(f"rendering and comparing, measured inside the loop: {100 * share:.2f}% of a step-wise step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/calculator-sft/model", help="Policy; 'preset:NAME' builds one.")
    parser.add_argument("--rounds", type=int, default=6, help="Steps of each variant (the first is a warm-up).")
    parser.add_argument("--prompts", type=int, default=12, help="trainer.prompts_per_step (the example's 12).")
    parser.add_argument("--group-size", type=int, default=8, help="trainer.group_size (the example's 8).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model.startswith("preset:"):
            args.model = str(init_model(args.model.removeprefix("preset:"), Path(tmp) / "model"))
        report(asyncio.run(measure(args, Path(tmp) / "runs")))


if __name__ == "__main__":
    main()

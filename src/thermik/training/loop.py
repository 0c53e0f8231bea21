"""The outer loop of an RL run, shared by `thermik rl` on one process (training/rl.py) and on Ray
(distributed/rl.py): held-out evaluation before, the steps with metrics, progress, periodic evaluation and
checkpoints, then evaluation after, the final checkpoint, export, plots and the before/after table."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from thermik.config.schema import RunConfig
from thermik.monitor.metrics import MetricsLogger
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress, print_table
from thermik.rollout.evaluation import EvalResult


class LoopRun(Protocol):
    cfg: RunConfig
    logger: MetricsLogger
    start_step: int  # steps already done (a resumed run)


async def run_loop(
    run: LoopRun,
    rl_step: Callable[[int], Awaitable[dict[str, float]]],
    evaluate: Callable[[str], Awaitable[EvalResult]],
    save: Callable[[int], None],
    export: Callable[[], object],
    title: str,
    start: Callable[[], Awaitable[None]] | None = None,
    stop: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """`start` runs after the evaluation before training (push resumed weights, start a producer), `stop` after
    the last step. Returns {"before": ..., "after": ...} as dicts."""
    cfg = run.cfg
    before = await _before(run, evaluate)
    if start is not None:
        await start()
    samples_per_step = cfg.trainer.prompts_per_step * cfg.trainer.group_size
    with StepProgress(cfg.trainer.steps, title, cfg.monitor.progress) as progress:
        progress.update(run.start_step)
        for step in range(run.start_step, cfg.trainer.steps):
            metrics = await rl_step(step)
            metrics["progress/samples"] = float((step + 1) * samples_per_step)
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.trainer.steps:
                metrics.update((await evaluate(f"step_{step + 1}")).as_metrics())
            run.logger.log(step + 1, metrics)
            progress.update(step + 1, {"reward": metrics["reward/mean"], "step_s": metrics["time/step"]})
            if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                save(step + 1)
    if stop is not None:
        await stop()
    after = await evaluate("after")
    run.logger.log(cfg.trainer.steps, after.as_metrics())
    if not cfg.checkpoint.every or cfg.trainer.steps % cfg.checkpoint.every:
        save(cfg.trainer.steps)
    export()
    plot_run(cfg.run_dir / "metrics.jsonl", cfg.run_dir)
    print_summary(cfg, before, after)
    return {"before": None if before is None else before.__dict__, "after": after.__dict__}


async def _before(run: LoopRun, evaluate: Callable[[str], Awaitable[EvalResult]]) -> EvalResult | None:
    """The evaluation before training: from eval_before.json when a resumed run has one, else run now."""
    if not run.cfg.eval.before:
        return None
    path = run.cfg.run_dir / "eval_before.json"
    if path.exists():
        return EvalResult(**json.loads(path.read_text()))
    before = await evaluate("before")
    run.logger.log(0, before.as_metrics())  # step 0 on the reward plot
    return before


def print_summary(cfg: RunConfig, before: EvalResult | None, after: EvalResult) -> None:
    rows = [
        [label, f"{r.success:.3f}", f"{r.reward:.3f}", f"{r.turns:.2f}", str(r.n)]
        for label, r in (("before", before), ("after", after))
        if r is not None
    ]
    title = f"held-out {cfg.env.name} (temperature {cfg.eval.temperature})"
    print_table(title, ["policy", "success", "mean reward", "mean turns", "n"], rows)

"""The one outer loop of every run mode: evaluation before, the steps with metrics, progress, periodic evaluation
and checkpoints, then the mode's stop, evaluation after, the final checkpoint, export, plots and the summary.

A mode (local, Ray, split trainer, split orchestrator, SFT) supplies the hooks of `Mode`; a `LoopPlan`, built
from its config, says which of the optional parts run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from thermik.config.schema import RunConfig
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress, print_table
from thermik.rollout.evaluation import EvalResult
from thermik.runs.build import Run
from thermik.runs.verdict import Verdict, prompt_limit, rl_verdict


@dataclass(frozen=True)
class LoopPlan:
    title: str
    steps: int
    eval_before: bool = False  # held-out evaluation before the first step (read back when a resumed run has it)
    eval_every: int = 0  # and every k steps (0: never during training)
    eval_after: bool = False  # and after the last step (then the periodic one skips the last step)
    checkpoint_every: int = 0  # checkpoint every k steps and at the end (0: only at the end, if `checkpoint`)
    checkpoint: bool = True
    samples_per_step: int = 0  # logged as progress/samples when > 0
    show: tuple[tuple[str, str], ...] = (("reward", "reward/mean"), ("step_s", "time/step"))  # progress fields
    progress: bool = True
    verdict: bool = False  # RL: prompts measured before any work, partial failures watched, a batch trained at the end


class Mode(Protocol):
    """The hooks the loop calls. A mode subclasses this and overrides what it does; the rest are no-ops."""

    async def step(self, step: int) -> dict[str, float]: ...
    async def evaluate(self, label: str) -> EvalResult: ...

    async def start(self) -> None:
        return None

    def save(self, step: int) -> None:
        return None

    def evaluates_at(self, step: int) -> bool:
        return False  # an evaluation the mode schedules itself, beside plan.eval_every (SFT's held-out check)

    def done(self, step: int, metrics: dict[str, float]) -> bool:
        return False  # stop early (SFT's held-out threshold)

    async def stop(self) -> None:
        return None

    def export(self) -> object:
        return None


def rl_plan(cfg: RunConfig, title: str) -> LoopPlan:
    """The plan of `thermik rl` (one process or Ray)."""
    return LoopPlan(
        title=title,
        steps=cfg.trainer.steps,
        eval_before=cfg.eval.before,
        eval_every=cfg.eval.every,
        eval_after=True,
        checkpoint_every=cfg.checkpoint.every,
        samples_per_step=cfg.trainer.prompts_per_step * cfg.trainer.group_size,
        progress=cfg.monitor.progress,
        verdict=True,
    )


async def run_loop(mode: Mode, run: Run, plan: LoopPlan) -> dict[str, Any]:
    """Returns {"before": ..., "after": ..., "steps": last step} (evaluations as dicts, None when not run). With
    plan.verdict: a prompt limit too small for every prompt is refused first, and a run that trained no batch
    ends with NothingDoneError (runs/verdict.py)."""
    verdict = None
    if plan.verdict and run.rollout is not None:
        verdict = rl_verdict(run.cfg.failures, await prompt_limit(run.rollout))
    run.accept()  # set up without failing: config.toml is this config now; a resumed run says so
    before = await _before(mode, run, plan) if plan.eval_before else None
    await mode.start()
    last = await _steps(mode, run, plan, verdict)
    await mode.stop()
    if run.rollout is not None and run.rollout.rewards is not None:
        run.rollout.rewards.check_answered()  # a reward source that never answered: nothing was trained (exit 3)
    after = None
    if plan.eval_after:
        after = await mode.evaluate("after")
        run.logger.log(plan.steps, after.as_metrics())
    saved = plan.checkpoint_every and last % plan.checkpoint_every == 0
    if plan.checkpoint and last > run.start_step and not saved:
        mode.save(last)
    mode.export()
    plot_run(run.logger.path, run.out_dir)
    if after is not None:
        print_summary(run.cfg, before, after)
    if verdict is not None and last > run.start_step:
        verdict.conclude()
    return {"before": _as_dict(before), "after": _as_dict(after), "steps": last}


async def _steps(mode: Mode, run: Run, plan: LoopPlan, verdict: Verdict | None = None) -> int:
    """Steps start_step..plan.steps; returns the number of the last one done (early stops end sooner)."""
    done = run.start_step
    with StepProgress(plan.steps, plan.title, plan.progress) as progress:
        progress.update(done)
        for step in range(run.start_step, plan.steps):
            metrics = await mode.step(step)
            done = step + 1
            if plan.samples_per_step:
                metrics["progress/samples"] = float(done * plan.samples_per_step)
            if _evaluates_at(plan, done) or mode.evaluates_at(done):
                metrics.update((await mode.evaluate(f"step_{done}")).as_metrics())
            run.logger.log(done, metrics)
            if verdict is not None:
                verdict.observe(metrics, f"step {done}")
            progress.update(done, {label: metrics.get(key, 0.0) for label, key in plan.show})
            if plan.checkpoint_every and done % plan.checkpoint_every == 0:
                mode.save(done)
            if mode.done(done, metrics):
                break
    return done


def _evaluates_at(plan: LoopPlan, done: int) -> bool:
    if not plan.eval_every or done % plan.eval_every:
        return False
    return done < plan.steps or not plan.eval_after


async def _before(mode: Mode, run: Run, plan: LoopPlan) -> EvalResult | None:
    """The evaluation before training: from eval_before.json when a resumed run has one, else run now."""
    path = run.cfg.run_dir / "eval_before.json"
    if path.exists():
        return EvalResult(**json.loads(path.read_text()))
    before = await mode.evaluate("before")
    run.logger.log(0, before.as_metrics())  # step 0 on the reward plot
    return before


def _as_dict(result: EvalResult | None) -> dict[str, Any] | None:
    return None if result is None else result.__dict__


def print_summary(cfg: RunConfig, before: EvalResult | None, after: EvalResult) -> None:
    rows = [
        [label, f"{r.success:.3f} ± {r.success_se:.3f}", f"{r.reward:.3f}", f"{r.turns:.2f}", str(r.n)]
        for label, r in (("before", before), ("after", after))
        if r is not None
    ]
    title = f"held-out {cfg.env.name} (temperature {cfg.eval.temperature})"
    print_table(title, ["policy", "success ± s.e.", "mean reward", "mean turns", "n"], rows)

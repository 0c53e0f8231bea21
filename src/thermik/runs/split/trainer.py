"""`thermik trainer`: the training half of a split run (docs/process_split.md).

Per step s: wait for `rollouts/step_<s>`, run the same update as `thermik rl` (`learner.train_on_batch`), publish
`weights/step_<s+1>`, log, checkpoint. Resumes from `checkpoints/latest` like `thermik rl`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from thermik.assembly import components
from thermik.config.schema import RunConfig
from thermik.inference import shared_weights
from thermik.inference.shared_weights import write_shared
from thermik.inference.weights import WEIGHTS_FILE, write_safetensors
from thermik.rollout.evaluation import EvalResult
from thermik.rollout.staleness import is_asynchronous, max_staleness
from thermik.runs.build import Run, build_run
from thermik.runs.loop import LoopPlan, Mode, run_loop
from thermik.runs.split import doorbell
from thermik.runs.split.protocol import (
    META_FILE,
    SplitLayout,
    load_batch,
    prune_steps,
    publish_dir,
    published_steps,
    wait_until,
)
from thermik.runs.step import Rollout, learner_update, rl_step
from thermik.training.batch import TokenBatch
from thermik.training.learner import Learner
from thermik.training.run_checkpoint import save_checkpoint


class SplitTrainerMode(Mode):
    """The StepHalves and loop hooks of `thermik trainer`: batches from files in, weight files out."""

    def __init__(self, run: Run, layout: SplitLayout) -> None:
        assert run.learner is not None
        self.run, self.cfg, self.layout = run, run.cfg, layout
        self.learner: Learner = run.learner
        self.rollouts_rung = doorbell.Doorbell(layout.run_dir, doorbell.ROLLOUTS)  # the orchestrator published a batch

    async def start(self) -> None:
        await self.rollouts_rung.start()

    async def rollout(self, step: int) -> Rollout:
        """The orchestrator's batch of step s (sampled by weights of step >= s - max_staleness)."""
        t0 = time.perf_counter()
        batch, meta = await wait_for_rollouts(self.layout, step, self.cfg, self.rollouts_rung)
        staleness = float(step - int(meta["weight_step"]))
        return Rollout(
            [], [], batch, {"off_policy/staleness_max": staleness, "time/wait_rollouts": time.perf_counter() - t0}
        )

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]:
        return await learner_update(self.learner, rollout, step, asynchronous=is_asynchronous(self.cfg))

    async def sync_weights(self, step: int) -> dict[str, float]:
        """Publish weights/step_<s+1> for the orchestrator to load into the server, and ring its doorbell."""
        t0 = time.perf_counter()
        await asyncio.to_thread(publish_weights, self.learner, self.layout, step + 1)
        return {"weights/step": float(step + 1), "time/weight_sync": time.perf_counter() - t0}

    async def stop(self) -> None:
        await self.rollouts_rung.close()

    async def step(self, step: int) -> dict[str, float]:
        return await rl_step(self, step)

    async def evaluate(self, label: str) -> EvalResult:
        raise RuntimeError("the split trainer does not evaluate: the orchestrator does, on the inference server")

    def save(self, step: int) -> None:
        save_checkpoint(self.learner, step)
        prune_steps(self.layout.rollouts, step)  # a resumed trainer starts at `step`: older batches are never read

    def export(self) -> Path:
        out = self.cfg.run_dir / "export"
        components.export_policy(self.learner.policy, self.run.chat, out)
        return out


def setup_trainer(cfg: RunConfig) -> SplitTrainerMode:
    layout = SplitLayout(cfg.run_dir)
    mode = SplitTrainerMode(build_run(cfg, out_dir=layout.trainer_dir), layout)
    if mode.run.resumed is not None:
        publish_weights(mode.learner, layout, mode.run.start_step)  # a restarted server or orchestrator picks them up
    return mode


def publish_weights(learner: Learner, layout: SplitLayout, step: int) -> Path:
    """weights/step_<step>: what a weight sync sends (LoRA merged in), published by `publish_state`."""
    return publish_state(components.engine_weights(learner.policy), layout, step, learner.cfg)


def publish_state(state: dict[str, torch.Tensor], layout: SplitLayout, step: int, cfg: RunConfig) -> Path:
    """weights/step_<step> atomically, in a reused shared-memory segment or as a model.safetensors file
    (split.weight_transfer); older directories the orchestrator can no longer need are removed; the orchestrator's
    doorbell rings."""
    if uses_shared_memory(cfg):
        segment = slot_segment(layout, step, max_staleness(cfg) + 2)
        path = publish_dir(layout.weights_dir(step), lambda tmp: write_shared(state, tmp, segment, step))
    else:
        path = publish_dir(layout.weights_dir(step), lambda tmp: write_safetensors(state, tmp / WEIGHTS_FILE))
    # The orchestrator loads every published step in order and is at most max_staleness + 1 behind.
    prune_steps(layout.weights, step - max_staleness(cfg) - 1)
    doorbell.ring(layout.run_dir, doorbell.WEIGHTS, f"step {step}")
    return path


def slot_segment(layout: SplitLayout, step: int, slots: int) -> str:
    """The shared-memory segment of `step`: slot step mod `slots` of this run directory. The orchestrator is never
    more than max_staleness + 1 steps behind (it loads every step in order), so max_staleness + 2 slots are never
    overwritten while it may still load them (a reader checks the step the segment holds, too)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", layout.run_dir.name)[:40]
    return f"thermik-{name}-{doorbell.run_key(layout.run_dir)}-slot{step % slots}"


def uses_shared_memory(cfg: RunConfig) -> bool:
    """split.weight_transfer: 'auto' takes shared memory when the inference server is on this machine."""
    if cfg.split.weight_transfer == "auto":
        host = urlparse(cfg.inference.base_url).hostname or ""
        return shared_weights.available() and (host == "localhost" or _is_loopback(host))
    return cfg.split.weight_transfer == "shared_memory"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def wait_for_rollouts(
    layout: SplitLayout, step: int, cfg: RunConfig, rung: doorbell.Doorbell | None = None
) -> tuple[TokenBatch, dict[str, Any]]:
    """The batch and meta of rollouts/step_<step>, once the orchestrator has published them (looked for again when
    `rung` rings)."""
    directory = layout.rollout_dir(step)
    await wait_until(
        lambda: True if step in published_steps(layout.rollouts) else None,
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the rollouts of step {step} ({directory})",
        check="that `thermik orchestrator` runs with this config and reaches its inference server (see the "
        "orchestrator's log and orchestrator/metrics.jsonl)",
        doorbell=rung,
    )
    return load_batch(directory), json.loads((directory / META_FILE).read_text())


async def train_split(cfg: RunConfig) -> dict[str, Any]:
    mode = setup_trainer(cfg)
    plan = LoopPlan(
        title=f"trainer {cfg.env.name}",
        steps=cfg.trainer.steps,
        checkpoint_every=cfg.checkpoint.every,
        show=(("loss", "policy/loss"),),
        progress=cfg.monitor.progress,
    )
    try:
        await run_loop(mode, mode.run, plan)
        return {"steps": cfg.trainer.steps, "weights": str(mode.layout.weights_dir(cfg.trainer.steps))}
    finally:
        await mode.run.close()


def run_trainer(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train_split(cfg))

"""`thermik trainer`: the training half of a split run.

Per step s: wait for `rollouts/step_<s>`, run the same update as `thermik rl` (`learner.train_on_batch`), publish
`weights/step_<s+1>`, log, checkpoint. Resumes from `checkpoints/latest` like `thermik rl`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from thermik.config.loader import dump_toml
from thermik.config.schema import RunConfig
from thermik.inference.weights import WEIGHTS_FILE, write_safetensors
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress
from thermik.training import components
from thermik.training.batch import TokenBatch
from thermik.training.learner import Learner, learner_parts, restore, save_checkpoint, train_on_batch
from thermik.training.split.protocol import (
    META_FILE,
    SplitLayout,
    load_batch,
    prune_steps,
    publish_dir,
    published_steps,
    wait_until,
)


def setup_trainer(cfg: RunConfig) -> tuple[Learner, SplitLayout]:
    components.seed_everything(cfg.seed)
    layout = SplitLayout(cfg.run_dir)
    layout.trainer_dir.mkdir(parents=True, exist_ok=True)
    (layout.trainer_dir / "config.toml").write_text(dump_toml(cfg))
    policy, chat = components.load_policy(cfg.model, cfg.lora)
    learner = Learner(cfg=cfg, policy=policy, chat=chat, **learner_parts(cfg, policy, layout.trainer_dir))
    if restore(learner) is not None:
        print(f"thermik trainer: resumed {cfg.run_dir} at step {learner.start_step} of {cfg.trainer.steps}")
        publish_weights(learner, layout, learner.start_step)  # a restarted server or orchestrator picks them up
    return learner, layout


def publish_weights(learner: Learner, layout: SplitLayout, step: int) -> Path:
    """weights/step_<step>/model.safetensors (what a weight sync sends: LoRA merged in), atomically; older ones
    the orchestrator can no longer need are removed."""
    state = components.engine_weights(learner.policy)
    path = publish_dir(layout.weights_dir(step), lambda tmp: write_safetensors(state, tmp / WEIGHTS_FILE))
    # The orchestrator loads every published step in order and is at most max_off_policy_steps + 1 behind.
    prune_steps(layout.weights, step - learner.cfg.trainer.max_off_policy_steps - 1)
    return path


async def wait_for_rollouts(layout: SplitLayout, step: int, cfg: RunConfig) -> tuple[TokenBatch, dict[str, Any]]:
    """The batch and meta of rollouts/step_<step>, once the orchestrator has published them."""
    directory = layout.rollout_dir(step)
    await wait_until(
        lambda: True if step in published_steps(layout.rollouts) else None,
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the rollouts of step {step} ({directory})",
        check="that `thermik orchestrator` runs with this config and reaches its inference server (see the "
        "orchestrator's log and orchestrator/metrics.jsonl)",
    )
    return load_batch(directory), json.loads((directory / META_FILE).read_text())


async def trainer_step(learner: Learner, layout: SplitLayout, step: int) -> dict[str, float]:
    cfg = learner.cfg
    t0 = time.perf_counter()
    # 1. The orchestrator's batch of step s (sampled by weights of step >= s - max_off_policy_steps).
    batch, meta = await wait_for_rollouts(layout, step, cfg)
    t_wait = time.perf_counter() - t0
    # 2.+3. Advantages -> policy (and critic) update: the same code as `thermik rl`.
    off_policy = cfg.trainer.max_off_policy_steps > 0
    metrics, t_train = await train_on_batch(learner, batch, step, rollout_is_behaviour=off_policy)
    # 4. Weight sync: publish weights/step_<s+1> for the orchestrator to load into the server.
    t0 = time.perf_counter()
    await asyncio.to_thread(publish_weights, learner, layout, step + 1)
    return {
        **metrics,
        "weights/step": float(step + 1),
        "off_policy/staleness_max": float(step - int(meta["weight_step"])),
        "time/wait_rollouts": t_wait,
        "time/train": t_train,
        "time/weight_sync": time.perf_counter() - t0,
        "perf/train_tokens_per_s": float(batch.attention_mask.sum()) / max(t_train, 1e-9),
    }


async def train_split(cfg: RunConfig) -> dict[str, Any]:
    learner, layout = setup_trainer(cfg)
    steps = cfg.trainer.steps
    try:
        with StepProgress(steps, f"trainer {cfg.env.name}", cfg.monitor.progress) as progress:
            progress.update(learner.start_step)
            for step in range(learner.start_step, steps):
                metrics = await trainer_step(learner, layout, step)
                learner.logger.log(step + 1, metrics)
                progress.update(step + 1, {"loss": metrics.get("policy/loss", 0.0)})
                if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                    _checkpoint(learner, layout, step + 1)
        if learner.start_step < steps and (not cfg.checkpoint.every or steps % cfg.checkpoint.every):
            _checkpoint(learner, layout, steps)
        components.export_policy(learner.policy, learner.chat, cfg.run_dir / "export")
        plot_run(layout.trainer_dir / "metrics.jsonl", layout.trainer_dir)
        return {"steps": steps, "weights": str(layout.weights_dir(steps))}
    finally:
        learner.logger.close()


def _checkpoint(learner: Learner, layout: SplitLayout, step: int) -> None:
    save_checkpoint(learner, step)
    prune_steps(layout.rollouts, step)  # a resumed trainer starts at `step`: older batches are never read again


def run_trainer(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(train_split(cfg))

"""`thermik orchestrator`: the rollout half of a split run, driving a `thermik inference` server over HTTP.

Per step s: wait until the trainer has published weights of a step >= s - max_off_policy_steps, have the server
load every newer weight directory in order (POST /update_weights), sample the step's groups (rewards come from
the environments), and publish the collated batch as `rollouts/step_<s>`. Advantages are computed by the trainer:
estimators may need the critic's values or the reference's logprobs, which live there. Held-out evaluation runs
before the first and after the last step, on the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thermik.atomic import write_json_atomic
from thermik.config.loader import dump_toml
from thermik.config.schema import RunConfig
from thermik.data.sampler import PromptSampler
from thermik.inference.remote import RemoteEngine
from thermik.models.loading import load_tokenizer
from thermik.monitor.metrics import MetricsLogger
from thermik.monitor.plots import plot_run
from thermik.monitor.progress import StepProgress
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import EvalResult
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.staleness import staleness_metrics, within_staleness
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import Trajectory, dump_trajectories
from thermik.tools.mcp_pool import MCPPool
from thermik.training import components
from thermik.training.batch import collate
from thermik.training.rollout_context import RolloutContext, evaluate_held_out, sample_step
from thermik.training.split.protocol import (
    META_FILE,
    TRAJECTORIES_FILE,
    SplitLayout,
    publish_dir,
    published_steps,
    save_batch,
    wait_until,
)


@dataclass(kw_only=True)
class Orchestrator(RolloutContext):
    engine: RemoteEngine
    layout: SplitLayout
    logger: MetricsLogger
    start_step: int = 0
    weight_step: int = 0  # trainer step of the weights the server holds
    step_of_version: dict[int, int] = field(default_factory=dict)  # server weight version -> trainer step


async def setup_orchestrator(cfg: RunConfig, pool: MCPPool) -> Orchestrator:
    components.seed_everything(cfg.seed)
    layout = SplitLayout(cfg.run_dir)
    layout.orchestrator_dir.mkdir(parents=True, exist_ok=True)
    (layout.orchestrator_dir / "config.toml").write_text(dump_toml(cfg))
    chat = ChatTokenizer(load_tokenizer(cfg.model.path, cfg.model.chat_template), cfg.env.tool_parser)
    train_rows, held_out = components.load_datasets(cfg.data, cfg.env.name)
    inf = cfg.inference
    orch = Orchestrator(
        cfg=cfg,
        chat=chat,
        engine=RemoteEngine(
            inf.base_url,
            api_key=inf.api_key or None,
            model=inf.served_model_name or None,
            stop_token_ids=chat.stop_ids,
            timeout_s=inf.timeout_s,
        ),
        make_env=components.env_factory(cfg.env, pool),
        sampler=PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=LoopLimits.from_config(cfg.rollout, cfg.env.max_turns),
        layout=layout,
        logger=MetricsLogger(layout.orchestrator_dir, cfg.monitor.tensorboard, cfg.monitor.wandb_project),
    )
    state_file = layout.orchestrator_state
    if cfg.checkpoint.resume and state_file.is_file():
        state = json.loads(state_file.read_text())
        orch.start_step = int(state["next_step"])
        orch.sampler.load_state_dict(state["sampler"])
        orch.logger.truncate_after(orch.start_step + 1)
        print(f"thermik orchestrator: resumed {cfg.run_dir} at step {orch.start_step} of {cfg.trainer.steps}")
    # A fresh server holds model.path, the weights of step 0; after a restart it is told the newest ones.
    version = await wait_until(
        lambda: _server_version(orch.engine),
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the inference server at {inf.base_url}",
        check="that `thermik inference` runs with this config (server.port must match inference.base_url)",
    )
    published = published_steps(layout.weights)
    if published:
        await _load(orch, published[-1])
    else:
        orch.step_of_version[version] = 0
    return orch


async def _server_version(engine: RemoteEngine) -> int | None:
    try:
        return await engine.refresh_version()
    except ConnectionError:
        return None


async def _load(orch: Orchestrator, step: int) -> None:
    version = await orch.engine.update_weights(orch.layout.weights_dir(step).resolve())
    orch.step_of_version[version] = step
    orch.weight_step = step


async def load_new_weights(orch: Orchestrator, step: int, max_off_policy_steps: int) -> float:
    """Wait until `step` is admitted (weights of a step >= step - max_off_policy_steps are published; step 0 is
    model.path), then have the server load every published step newer than the one it holds, in order (so a fresh
    server's weight version equals the trainer step). Returns the seconds spent waiting."""
    cfg = orch.cfg
    t0 = time.perf_counter()
    need = step - max_off_policy_steps

    def ready() -> bool | None:
        newest = max(published_steps(orch.layout.weights), default=0)
        return True if within_staleness(max(newest, orch.weight_step), step, max_off_policy_steps) else None

    await wait_until(
        ready,
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the weights of step {need} ({orch.layout.weights_dir(need)})",
        check="that `thermik trainer` runs with this config (see the trainer's log and trainer/metrics.jsonl)",
    )
    waited = time.perf_counter() - t0
    for step in published_steps(orch.layout.weights):
        if step > orch.weight_step:
            await _load(orch, step)
    return waited


def staleness(orch: Orchestrator, step: int, trajs: list[Trajectory]) -> list[int]:
    """Per trajectory: step minus the trainer step of the oldest weights behind any of its sampled tokens."""
    out = []
    for t in trajs:
        versions = {v for v in t.weight_versions if v >= 0}
        unknown = versions - orch.step_of_version.keys()
        if unknown:
            raise RuntimeError(
                f"the server sampled with weight version(s) {sorted(unknown)} that this orchestrator did not load; "
                "is another process pushing weights to the same server?"
            )
        out.append(step - min((orch.step_of_version[v] for v in versions), default=orch.weight_step))
    return out


async def orchestrator_step(orch: Orchestrator, step: int) -> dict[str, float]:
    cfg = orch.cfg
    t_step = time.perf_counter()
    # 1. Admission: weights of step >= s - max_off_policy_steps, loaded into the server.
    t_wait = await load_new_weights(orch, step, cfg.trainer.max_off_policy_steps)
    # 2. Rollout: n samples per prompt on the server, rewards from the environments (+ DAPO dynamic sampling).
    t0 = time.perf_counter()
    sampled, trajs, batch_metrics = await sample_step(orch, step)
    t_generate = time.perf_counter() - t0
    stale = staleness(orch, step, trajs)
    if max(stale) > cfg.trainer.max_off_policy_steps:  # the admission rule makes this impossible; say so if not
        raise RuntimeError(f"step {step}: staleness {max(stale)} > trainer.max_off_policy_steps")
    # 3. Publish the collated batch (advantages are the trainer's) and the trajectories, then the resume state.
    batch = collate(trajs, None, orch.chat.tokenizer.pad_token_id or 0)
    meta = {"step": step, "weight_step": step - max(stale), "num_samples": len(trajs)}

    def write(directory: Path) -> None:
        save_batch(batch, directory)
        dump_trajectories(directory / TRAJECTORIES_FILE, trajs)
        write_json_atomic(directory / META_FILE, meta)

    await asyncio.to_thread(publish_dir, orch.layout.rollout_dir(step), write)
    write_json_atomic(orch.layout.orchestrator_state, {"next_step": step + 1, "sampler": orch.sampler.state_dict()})
    dump_every = cfg.monitor.save_trajectories_every
    if dump_every and (step + 1) % dump_every == 0:
        dump_trajectories(cfg.run_dir / "trajectories" / f"step_{step + 1}.jsonl", sampled)
    sampled_tokens = sum(t.num_generated_tokens for t in sampled)
    return {
        **rollout_metrics(sampled),
        **batch_metrics,
        **staleness_metrics(stale),
        "weights/step": float(orch.weight_step),
        "time/wait_weights": t_wait,
        "time/generate": t_generate,
        "time/step": time.perf_counter() - t_step,
        "perf/tokens_per_s": sampled_tokens / max(t_generate, 1e-9),
        "progress/samples": float((step + 1) * cfg.trainer.prompts_per_step * cfg.trainer.group_size),
    }


async def orchestrate(cfg: RunConfig) -> dict[str, Any]:
    pool = MCPPool(log_dir=cfg.run_dir / "logs")
    orch = await setup_orchestrator(cfg, pool)
    steps = cfg.trainer.steps
    try:
        before = None
        if cfg.eval.before and orch.start_step == 0 and orch.weight_step == 0:
            before = await evaluate_held_out(orch, "before", cfg.run_dir)
            orch.logger.log(0, before.as_metrics())
        with StepProgress(steps, f"orchestrator {cfg.env.name}", cfg.monitor.progress) as progress:
            progress.update(orch.start_step)
            for step in range(orch.start_step, steps):
                metrics = await orchestrator_step(orch, step)
                orch.logger.log(step + 1, metrics)
                progress.update(step + 1, {"reward": metrics["reward/mean"], "step_s": metrics["time/step"]})
        # The trainer's final weights, then the held-out evaluation on them.
        await load_new_weights(orch, steps, 0)
        after = await evaluate_held_out(orch, "after", cfg.run_dir)
        orch.logger.log(steps, after.as_metrics())
        plot_run(orch.layout.orchestrator_dir / "metrics.jsonl", orch.layout.orchestrator_dir)
        return {"before": _as_dict(before), "after": _as_dict(after), "weight_step": orch.weight_step}
    finally:
        orch.logger.close()
        await orch.engine.close()
        await pool.aclose()


def _as_dict(result: EvalResult | None) -> dict[str, Any] | None:
    return None if result is None else result.__dict__


def run_orchestrator(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(orchestrate(cfg))

"""`thermik orchestrator`: the rollout half of a split run, driving a `thermik inference` server over HTTP.

Synchronous (max_staleness 0), per step s: wait until the trainer has published the weights of step s, have the
server load them (POST /update_weights, as version s), sample the step's groups (rewards come from the
environments), and publish the collated batch as `rollouts/step_<s>`. Asynchronous: a GroupProducer samples groups
continuously (bounded staleness, as `thermik rl`), and a follower task has the server load each weight directory
the moment the trainer publishes it (the trainer rings: doorbell.py); the server takes them between decode steps,
so running episodes go on under the new weights (partial rollouts) with each token's version recorded, and step
s's batch is the oldest admissible groups for the trainer's weights of step s. Advantages are computed by the trainer:
estimators may need the critic's values or the reference's logprobs, which live there. Held-out evaluation runs on
the server before the first step, after every `eval.every` steps (on the trainer's weights of that step, which the
orchestrator waits for) and after the last step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from thermik.assembly.guards import ConsistencyGuards, served_weight_check
from thermik.atomic import write_json_atomic
from thermik.config.schema import RunConfig
from thermik.inference.remote import RemoteEngine
from thermik.inference.server.run import use_short_switch_interval
from thermik.inference.shared_weights import unlink_segment
from thermik.rollout.context import RolloutContext, evaluate_held_out, sample_groups
from thermik.rollout.evaluation import EvalResult
from thermik.rollout.group_producer import GroupProducer
from thermik.rollout.staleness import is_asynchronous, max_staleness, staleness_metrics, within_staleness
from thermik.rollout.trajectory import Trajectory, dump_trajectories
from thermik.runs.build import Run, build_run, resume_logger
from thermik.runs.loop import LoopPlan, Mode, run_loop
from thermik.runs.split import doorbell
from thermik.runs.split.protocol import (
    META_FILE,
    TRAJECTORIES_FILE,
    SplitLayout,
    SplitTimeout,
    publish_dir,
    published_steps,
    save_batch,
    wait_until,
)
from thermik.runs.step import Rollout, make_rollout, produced_rollout, rl_step, start_producer
from thermik.training.batch import collate


class OrchestratorMode(Mode):
    """The StepHalves and loop hooks of `thermik orchestrator`: weights in (at admission, or as published when
    asynchronous), batches out."""

    def __init__(self, run: Run, layout: SplitLayout) -> None:
        assert run.rollout is not None
        self.run, self.cfg, self.layout = run, run.cfg, layout
        self.rollout_ctx: RolloutContext = run.rollout
        self.engine: RemoteEngine = run.rollout.engine  # type: ignore[assignment]
        self.weight_step = 0  # trainer step of the weights the server holds
        self.guards = ConsistencyGuards.for_run(self.cfg.guards, run.chat)
        self.guard_metrics: dict[str, float] = {}  # of the last admission's weight loads
        self.step_of_version: dict[int, int] = {}  # server weight version -> trainer step
        self.weights_rung = doorbell.Doorbell(layout.run_dir, doorbell.WEIGHTS)  # the trainer published weights
        self.loading = asyncio.Lock()  # one weight load at a time: the follower's, an evaluation's, the last one
        self.producer: GroupProducer | None = None  # asynchronous only, as the follower
        self.follower: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if is_asynchronous(self.cfg):
            self.producer = start_producer(self.rollout_ctx, first_version=self.run.start_step)
            self.follower = asyncio.create_task(follow_weights(self), name="thermik-weight-follower")

    async def rollout(self, step: int) -> Rollout:
        """Synchronous: admission (the weights of step s, loaded into the server), then sampling. Asynchronous:
        the producer's oldest groups admissible for the trainer's weights of step s."""
        if self.producer is not None:
            return await self._produced(step)
        cfg = self.cfg
        t_wait = await load_new_weights(self, step, max_staleness(cfg))
        t0 = time.perf_counter()
        sampled, trajs, metrics = await sample_groups(self.rollout_ctx, step)
        t_generate = time.perf_counter() - t0
        stale = staleness(self, step, sampled)  # all of them: the batch may be empty (groups left unscored)
        if max(stale, default=0) > max_staleness(cfg):  # impossible by the admission rule; say so if not
            raise RuntimeError(f"step {step}: staleness {max(stale)} > the staleness bound {max_staleness(cfg)}")
        metrics = {
            **metrics,
            **(staleness_metrics(stale) if stale else {}),
            "weights/step": float(self.weight_step),
            "time/wait_weights": t_wait,
            **self.guard_metrics,
            "time/generate": t_generate,
        }
        rollout = make_rollout(self.rollout_ctx, step, sampled, trajs, metrics)
        if rollout.batch is None:  # every prompt of the step skipped: the trainer gets an empty batch, skips its update
            rollout = dataclasses.replace(rollout, batch=collate([], None, 0))
        return rollout

    async def _produced(self, step: int) -> Rollout:
        assert self.producer is not None
        t0 = time.perf_counter()
        batch = asyncio.create_task(produced_rollout(self.rollout_ctx, self.producer, step, trainer_version=step))
        done, _ = await asyncio.wait({batch, *filter(None, [self.follower])}, timeout=self.cfg.split.wait_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if batch not in done:  # the follower failed (its error is raised here), or the trainer is silent
            batch.cancel()
            if self.follower is not None and self.follower.done():
                self.follower.result()
            raise SplitTimeout(
                f"waited {self.cfg.split.wait_timeout_s:g} s for the groups of step {step} (they need the weights of "
                f"step {step - max_staleness(self.cfg)}); check that `thermik trainer` runs with this config, or "
                "raise split.wait_timeout_s if it is only slow"
            )
        rollout = batch.result()
        staleness(self, step, rollout.sampled)  # every version one this orchestrator loaded
        rollout.metrics |= {"weights/step": float(self.weight_step), "time/wait_weights": time.perf_counter() - t0,
                            **self.guard_metrics}  # fmt: skip
        return rollout

    async def update(self, rollout: Rollout, step: int) -> dict[str, float]:
        """Publish the collated batch (advantages are the trainer's) and its trajectories, then the resume state."""
        weight_step = step - int(rollout.metrics.get("off_policy/staleness_max", 0.0))
        meta = {"step": step, "weight_step": weight_step, "num_samples": len(rollout.trajs)}

        batch = rollout.batch
        assert batch is not None  # rl_step updates only a rollout with a batch

        def write(directory: Path) -> None:
            save_batch(batch, directory)
            dump_trajectories(directory / TRAJECTORIES_FILE, rollout.trajs)
            write_json_atomic(directory / META_FILE, meta)

        await asyncio.to_thread(publish_dir, self.layout.rollout_dir(step), write)
        doorbell.ring(self.layout.run_dir, doorbell.ROLLOUTS, f"step {step}")
        state = {"next_step": step + 1, "sampler": self.rollout_ctx.sampler.state_dict()}
        write_json_atomic(self.layout.orchestrator_state, state)
        return {}

    async def sync_weights(self, step: int) -> dict[str, float]:
        return {}  # the next step's admission loads the trainer's newer weights

    async def step(self, step: int) -> dict[str, float]:
        return await rl_step(self, step)

    async def evaluate(self, label: str) -> EvalResult:
        if label.startswith("step_"):  # eval.every: the policy after that many updates, as `thermik rl` evaluates
            await load_new_weights(self, int(label.removeprefix("step_")), 0)
        return await evaluate_held_out(self.rollout_ctx, label, self.cfg.run_dir)

    async def stop(self) -> None:
        """Stop producing (groups in flight are not trained any more), load the trainer's final weights for the
        evaluation after, and free the shared memory of every published step (the server holds its own copy)."""
        for task in filter(None, [self.follower]):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.producer is not None:
            await self.producer.stop()
        await load_new_weights(self, self.cfg.trainer.steps, 0)
        for published in published_steps(self.layout.weights):
            unlink_segment(self.layout.weights_dir(published))
        await self.weights_rung.close()


def _remote_engine(cfg: RunConfig, run_chat: Any) -> RemoteEngine:
    inf = cfg.inference
    return RemoteEngine(
        inf.base_url,
        api_key=inf.api_key or None,
        model=inf.served_model_name or None,
        stop_token_ids=run_chat.stop_ids,
        timeout_s=inf.timeout_s,
    )


async def setup_orchestrator(cfg: RunConfig) -> OrchestratorMode:
    layout = SplitLayout(cfg.run_dir)
    engine = lambda _policy, chat: _remote_engine(cfg, chat)  # noqa: E731
    run = build_run(cfg, out_dir=layout.orchestrator_dir, load_policy=False, engine=engine, learner=False)
    orch = OrchestratorMode(run, layout)
    await orch.weights_rung.start()
    if cfg.checkpoint.resume and layout.orchestrator_state.is_file():
        state = json.loads(layout.orchestrator_state.read_text())
        resume_logger(run, int(state["next_step"]), state["sampler"])
    # A fresh server holds model.path, the weights of step 0; after a restart it is told the newest ones.
    version = await wait_until(
        lambda: _server_version(orch.engine),
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the inference server at {cfg.inference.base_url}",
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


async def _load(orch: OrchestratorMode, step: int) -> None:
    """The server loads weights/step_<step> as its version `step` (between two decode steps: requests go on)."""
    version = await orch.engine.update_weights(orch.layout.weights_dir(step).resolve(), version=step)
    orch.step_of_version[version] = step
    orch.weight_step = step


async def follow_weights(orch: OrchestratorMode) -> None:
    """Asynchronous runs: load each weight directory into the server as soon as the trainer publishes it (it rings;
    a look every split.poll_interval_s covers a lost ring), then let the producer admit the groups it allows."""
    while True:
        await orch.weights_rung.wait(orch.cfg.split.poll_interval_s)
        if max(published_steps(orch.layout.weights), default=0) > orch.weight_step:
            await load_published(orch)
            if orch.producer is not None:
                await orch.producer.weights_updated()


async def load_new_weights(orch: OrchestratorMode, step: int, bound: int) -> float:
    """Wait until `step` is admitted (weights of a step >= step - bound are published; step 0 is
    model.path), then have the server load every published step newer than the one it holds, in order (so a fresh
    server's weight version equals the trainer step). Returns the seconds spent waiting."""
    cfg = orch.cfg
    t0 = time.perf_counter()
    need = step - bound

    def ready() -> bool | None:
        newest = max(published_steps(orch.layout.weights), default=0)
        return True if within_staleness(max(newest, orch.weight_step), step, bound) else None

    await wait_until(
        ready,
        cfg.split.wait_timeout_s,
        cfg.split.poll_interval_s,
        waiting_for=f"the weights of step {need} ({orch.layout.weights_dir(need)})",
        check="that `thermik trainer` runs with this config (see the trainer's log and trainer/metrics.jsonl)",
        doorbell=orch.weights_rung,
    )
    waited = time.perf_counter() - t0
    await load_published(orch)
    return waited


async def load_published(orch: OrchestratorMode) -> None:
    """Have the server load every published step newer than the one it holds, in order, then run the consistency
    guards on what it now holds: the newest weights the trainer published."""
    async with orch.loading:
        loaded = [s for s in published_steps(orch.layout.weights) if s > orch.weight_step]
        for published in loaded:
            t0 = time.perf_counter()
            await _load(orch, published)
            orch.guard_metrics = {"time/weight_load": time.perf_counter() - t0}
        if loaded:
            check = served_weight_check(orch.engine, orch.layout.weights_dir(loaded[-1]))
            orch.guard_metrics |= await orch.guards.after_sync(orch.engine, check, None, loaded[-1] - 1)


def staleness(orch: OrchestratorMode, step: int, trajs: list[Trajectory]) -> list[int]:
    """Per trajectory: step minus the trainer step of the oldest weights behind any of its sampled tokens."""
    out = []
    for t in trajs:
        versions = {v for v in t.all_weight_versions if v >= 0}
        unknown = versions - orch.step_of_version.keys()
        if unknown:
            raise RuntimeError(
                f"the server sampled with weight version(s) {sorted(unknown)} that this orchestrator did not load; "
                "is another process pushing weights to the same server?"
            )
        out.append(step - min((orch.step_of_version[v] for v in versions), default=orch.weight_step))
    return out


def orchestrator_plan(cfg: RunConfig, fresh: bool) -> LoopPlan:
    """The orchestrator's loop: evaluations before (on a `fresh` start), every eval.every steps and after."""
    return LoopPlan(
        title=f"orchestrator {cfg.env.name}",
        steps=cfg.trainer.steps,
        eval_before=cfg.eval.before and fresh,
        eval_every=cfg.eval.every,
        eval_after=True,
        checkpoint=False,
        samples_per_step=cfg.trainer.prompts_per_step * cfg.trainer.group_size,
        progress=cfg.monitor.progress,
        verdict=True,
    )


async def orchestrate(cfg: RunConfig) -> dict[str, Any]:
    orch = await setup_orchestrator(cfg)
    plan = orchestrator_plan(cfg, fresh=orch.run.start_step == 0 and orch.weight_step == 0)
    try:
        result = await run_loop(orch, orch.run, plan)
        return {"before": result["before"], "after": result["after"], "weight_step": orch.weight_step}
    finally:
        await orch.run.close()


def run_orchestrator(cfg: RunConfig) -> dict[str, Any]:
    use_short_switch_interval()  # its agent loops and HTTP client share one interpreter lock as the server's do
    return asyncio.run(orchestrate(cfg))

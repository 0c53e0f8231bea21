"""The training half of an RL run: policy (+ reference, critic), optimizer, checkpoints and one update per batch.

Built by `build_learner` from the run's config. The local run mode holds it beside the rollout half; the split
trainer holds it alone and reads its batches from files the orchestrator writes; each Ray trainer worker holds one
around its data-parallel wrap of the policy (distributed/trainer_worker.py). All of them call `train_on_batch`, so
the learner step (advantages, critic, reference and KL, the update, the KL controller) is one code path; a worker's
`UpdateSplit` trains its shard and agrees on the metrics with the other ranks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from thermik.algorithms.health import nonfinite_entries
from thermik.config.schema import RunConfig
from thermik.cpu.openmp import to_thread_releasing
from thermik.memory import release_freed_memory
from thermik.training import reference
from thermik.training.algo_state import AlgorithmState
from thermik.training.batch import TokenBatch
from thermik.training.batch_advantages import apply_distillation, assign_advantages
from thermik.training.checkpoint import CheckpointManager
from thermik.training.critic import Critic
from thermik.training.loss import LossSetup
from thermik.training.mixed_precision import autocast_dtype
from thermik.training.optim import build_optimizer
from thermik.training.speed import apply_train_speed
from thermik.training.teacher import Teacher, build_teacher
from thermik.training.update import logprobs_no_grad, policy_update

if TYPE_CHECKING:
    from thermik.training.run_checkpoint import TrainingStateView

Optimizers = tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]


class UpdateSplit(Protocol):
    """How the policy update's work is shared. `shard`: the rows this process trains (the whole batch in one
    process; a data-parallel rank's part of every mini-batch); `merge`: the metrics of the whole update, the same
    in every process. Advantages, critic and reference run on the whole batch everywhere."""

    def shard(self, batch: TokenBatch) -> TokenBatch: ...

    def merge(self, metrics: dict[str, float]) -> dict[str, float]: ...


class WholeBatch:
    """One process trains the whole batch."""

    def shard(self, batch: TokenBatch) -> TokenBatch:
        return batch

    def merge(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics


@dataclass(kw_only=True)
class Learner:
    """Everything the policy update holds across steps."""

    cfg: RunConfig
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoints: CheckpointManager
    algo: AlgorithmState
    critic: Critic | None = None  # advantage "gae" only
    start_step: int = 0
    update_threads: int = 0  # torch threads of the update thread; 0 inherits
    autocast: torch.dtype | None = None  # model.train_precision resolved once (training/mixed_precision.py)
    teacher: Teacher | None = None  # algorithm.teacher.source: on-policy distillation (training/teacher.py)
    split: UpdateSplit = field(default_factory=WholeBatch)  # a data-parallel rank's shard (distributed/)
    module: torch.nn.Module | None = None  # the plain model behind a data-parallel `policy` wrapper; None: policy
    state_view: TrainingStateView | None = None  # what a rank's checkpoint holds (distributed/); None: the whole policy


def build_learner(
    cfg: RunConfig,
    policy: torch.nn.Module,
    tokenizer: Any,
    update_threads: int = 0,
    wrap: Callable[[torch.nn.Module], Optimizers] | None = None,
) -> Learner:
    """The training half of a run around an already loaded policy (and its HF tokenizer, which a distillation
    teacher must share): reference, optimizer, checkpoints, critic, teacher. `wrap`: (trained module, optimizer,
    scheduler) around the policy, for data parallelism (after the reference copied the plain policy)."""
    autocast = autocast_dtype(cfg.model, policy)  # before the reference copies the policy (its lm head too)
    ref = reference.build_reference(policy, cfg.algorithm)
    applied = apply_train_speed(policy, cfg.trainer.activation_checkpointing, cfg.trainer.compile)  # after the copy
    if applied:
        print(f"thermik trainer: {', '.join(applied)}", file=sys.stderr)
    trained, optimizer, scheduler = (wrap or (lambda m: (m, *build_optimizer(m, cfg.trainer.optimizer))))(policy)
    return Learner(
        cfg=cfg,
        policy=trained,
        module=policy if trained is not policy else None,
        ref=ref,
        optimizer=optimizer,
        scheduler=scheduler,
        checkpoints=CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.checkpoint.keep),
        algo=AlgorithmState.from_config(cfg.algorithm),
        critic=_build_critic(cfg),
        update_threads=update_threads,
        autocast=autocast,
        teacher=build_teacher(cfg.algorithm, cfg.trainer, tokenizer, autocast, cfg.model.device),
    )


def _build_critic(cfg: RunConfig) -> Critic | None:
    """A value model when the advantage estimator needs one (gae)."""
    if cfg.algorithm.advantage.type != "gae":
        return None
    return Critic.from_config(cfg.model, cfg.critic, cfg.trainer.micro_batch_size)


async def train_on_batch(
    learner: Learner, batch: TokenBatch, step: int, *, asynchronous: bool
) -> tuple[dict[str, float], float]:
    """Advantages, then the policy (and critic) update, on one collated batch; returns (metrics, update seconds).

    asynchronous: the batch was sampled by older weights (asynchronous training), so the rollout logprobs
    are the behaviour policy of the PPO ratio. A batch of no rows (every group of the step left out, e.g. unscored by
    its model rewards) skips the update: the weights and the optimizer state stay as they are.
    """
    if len(batch) == 0:
        return {"health/skipped_update": 1.0, "batch/empty": 1.0}, 0.0
    skipped = _nonfinite_inputs(learner, batch)
    if skipped is not None:
        return skipped, 0.0
    cfg, alg = learner.cfg, learner.cfg.algorithm
    temperature = cfg.rollout.sampling.temperature or 1.0
    # Rewards -> shaped rewards (length terms, KL in reward mode) -> critic values (gae) -> advantages.
    reward_kl = learner.ref is not None and alg.kl.mode == "reward"
    fwd = (cfg.trainer.micro_batch_size, temperature, cfg.trainer.shared_prefix, learner.autocast, cfg.trainer.packing)
    ref_logp = logprobs_no_grad(learner.ref, batch, *fwd) if reward_kl else None
    values = None if learner.critic is None else learner.critic.values(batch)
    adv_metrics = assign_advantages(
        batch,
        alg,
        max_response_length=cfg.rollout.max_generate_length,
        ref_logp=ref_logp,
        kl_coef=learner.algo.kl.value,
        values=values,
    )
    if learner.teacher is not None:  # on-policy distillation: the teacher scores every sampled token
        t_teacher = time.perf_counter()
        adv_metrics |= apply_distillation(batch, await learner.teacher.logprobs(batch), alg)
        adv_metrics["time/teacher"] = time.perf_counter() - t_teacher
    # Policy (and critic) update on exactly the sampled token ids, in a thread: async rollouts and tool calls go on
    # meanwhile; then KL controller, health checks, reference refresh.
    t0 = time.perf_counter()
    update_metrics = await to_thread_releasing(_update, learner, batch, temperature, asynchronous)
    update_metrics = learner.split.merge(update_metrics)  # every data-parallel rank: the whole update's metrics
    release_freed_memory()  # the update's activations, so the engine's next rollout can reuse the pages
    state_metrics = learner.algo.after_update({**adv_metrics, **update_metrics}, len(batch))
    reference.maybe_refresh(learner.ref, learner.module or learner.policy, alg, step + 1)
    return {**adv_metrics, **update_metrics, **state_metrics}, time.perf_counter() - t0


def _nonfinite_inputs(learner: Learner, batch: TokenBatch) -> dict[str, float] | None:
    """NaN/inf in the batch's rewards or rollout logprobs (on trained tokens): the step's update is skipped, or the
    run halts (`algorithm.health.on_nonfinite`), naming the culprit; None when all are finite."""
    checks = [
        ("health/nonfinite_rewards", "reward", batch.token_rewards, None),
        ("health/nonfinite_rollout_logprobs", "rollout logprob", batch.rollout_logp, batch.mask),
    ]
    found = {key: nonfinite_entries(name, values, where) for key, name, values, where in checks if values is not None}
    bad = {key: entry for key, entry in found.items() if entry[0]}
    if not bad:
        return None
    learner.algo.guard.reject("; ".join(description for _, description in bad.values()), "updates")
    return {**{key: float(count) for key, (count, _) in bad.items()}, "health/skipped_update": 1.0}


def _update(learner: Learner, batch: TokenBatch, temperature: float, asynchronous: bool) -> dict[str, float]:
    """One policy update on this process's shard of the batch (and, with a critic, its value-loss update on the whole
    batch: every data-parallel rank keeps an identical critic)."""
    if learner.update_threads:
        torch.set_num_threads(learner.update_threads)  # this worker thread only (OpenMP thread counts are per thread)
    cfg = learner.cfg
    setup = LossSetup.from_config(
        cfg.algorithm, cfg.trainer, temperature, kl_coef=learner.algo.kl.value, autocast=learner.autocast
    )
    metrics = policy_update(
        learner.policy,
        learner.ref,
        learner.split.shard(batch),
        setup,
        learner.optimizer,
        learner.scheduler,
        guard=learner.algo.guard,
        asynchronous=asynchronous,
    )
    if learner.critic is not None:
        metrics.update(learner.critic.update(batch))
    return metrics

"""One data-parallel trainer rank, run as a Ray actor: a `Learner` around its DDP/FSDP2 wrap of the policy, running
the learner step of every run mode (`train_on_batch`) on the whole batch with its `RankShare` of the update.

Every rank gets the whole batch: advantages, critic values (and the critic's update), reference logprobs and the
teacher's run on all of it, so each rank holds the same critic and KL weight; the policy update trains this rank's
part of every mini-batch, gradients scaled and averaged across ranks, and `merge` gathers the ranks' metrics into
the single-process values. The class is plain Python (Ray wraps it with `ray.remote` in launch.py), so it imports
without Ray.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from thermik.assembly import components
from thermik.assembly.guards import checksum
from thermik.config.schema import DistributedConfig, RunConfig
from thermik.distributed import comm
from thermik.distributed.parallel import ShardScaledPolicy, full_grads, full_state_dict, unwrap, wrap_policy
from thermik.distributed.sharding import Shard, merge_metrics, shard_batch
from thermik.training.batch import TokenBatch, token_logprobs
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state
from thermik.training.learner import CRITIC_DIR, Learner, build_learner, train_on_batch
from thermik.training.optim import build_optimizer


class _FullModel:
    """save_pretrained of an FSDP2 model from its gathered full state dict (rank 0 writes)."""

    def __init__(self, model: Any, state: dict[str, torch.Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, path: Path) -> None:
        self.model.save_pretrained(path, state_dict=self.state)


class _FullOptimizer:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


class RankShare:
    """The `UpdateSplit` of rank `rank`: its part of every global mini-batch, with the gradient scales that make the
    averaged gradient the single-process one (sharding.py); the metrics gathered from every rank and merged."""

    def __init__(self, policy: ShardScaledPolicy, rank: int, world_size: int, cfg: RunConfig) -> None:
        self.policy, self.rank, self.world_size, self.cfg = policy, rank, world_size, cfg
        self.shards: list[Shard] = []

    def shard(self, batch: TokenBatch) -> TokenBatch:
        trainer, alg = self.cfg.trainer, self.cfg.algorithm
        self.shards = shard_batch(batch, self.world_size, trainer.mini_batches, alg.reduction.type)
        mine = self.shards[self.rank]
        self.policy.set_grad_scales(mine.grad_scales)
        return mine.batch

    def merge(self, metrics: dict[str, float]) -> dict[str, float]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, metrics)
        return merge_metrics(gathered, self.shards)


class TrainerWorker:
    """Rank `rank` of `world_size`; `setup` joins the process group and wraps the policy (all ranks at once)."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.dist_cfg: DistributedConfig = cfg.distributed
        components.seed_everything(cfg.seed)
        self.model, self.chat = components.load_policy(cfg.model, cfg.lora, cfg.env.tool_parser)
        self.learner: Learner | None = None  # built by setup, once the process group is up
        self._weights_group: comm.BroadcastGroup | None = None
        self._synced_state: dict[str, torch.Tensor] = {}

    def endpoint(self) -> tuple[str, int]:
        return comm.endpoint()

    def setup(self, addr: str, port: int) -> int:
        dc = self.dist_cfg
        comm.init_default_group(dc.backend, self.rank, self.world_size, addr, port, dc.timeout_s)
        self.device = comm.device_for(dc.backend, self.cfg.model.device)
        self.model.to(self.device)

        def wrap(model: torch.nn.Module) -> Any:
            optimizer = self.cfg.trainer.optimizer
            return wrap_policy(model, dc.strategy, self.device, lambda m: build_optimizer(m, optimizer))

        self.learner = learner = build_learner(self.cfg, self.model, self.chat.tokenizer, wrap=wrap)
        self.policy, self.optimizer, self.scheduler = learner.policy, learner.optimizer, learner.scheduler
        self.share = RankShare(self.policy, self.rank, self.world_size, self.cfg)
        self.learner.split = self.share
        return os.getpid()

    # ------------------------------------------------------------------ training

    def update(
        self, batch: TokenBatch, step: int, off_policy: bool = False, cfg: RunConfig | None = None
    ) -> dict[str, float]:
        """The learner step of every run mode on the whole batch (this rank trains its shard). off_policy: the batch
        was sampled by older weights (asynchronous training). cfg: this update's config instead of the run's (the
        same model; tests vary the reduction and mini-batches)."""
        assert self.learner is not None, "setup first"
        if cfg is not None:
            self.learner.cfg = self.share.cfg = cfg
        for name, value in batch.__dict__.items():
            if value is not None:
                setattr(batch, name, value.to(self.device))
        metrics, _ = asyncio.run(train_on_batch(self.learner, batch, step, rollout_is_behaviour=off_policy))
        return metrics

    def grads(self) -> dict[str, torch.Tensor]:
        return full_grads(self.policy)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return full_state_dict(self.policy)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, root: str, keep: int, step: int, extra: dict[str, Any]) -> str | None:
        """Every rank joins (FSDP2 gathers shards); rank 0 writes `root/step_<step>` atomically."""
        if self.dist_cfg.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model: Any = _FullModel(unwrap(self.policy), full_state_dict(self.policy))
            optimizer: Any = _FullOptimizer(get_optimizer_state_dict(unwrap(self.policy), self.optimizer, options=full))
        else:
            model, optimizer = unwrap(self.policy), self.optimizer
        assert self.learner is not None, "setup first"
        learner = self.learner
        extra = {**extra, "scheduler": self.scheduler.state_dict(), "kl_coef": learner.algo.kl.value}

        def write(directory: Path) -> None:
            save_training_state(directory, model, optimizer, step, extra=extra)
            if learner.critic is not None:  # the same on every rank
                learner.critic.save(directory / CRITIC_DIR)

        path = None
        if self.rank == 0:
            path = str(CheckpointManager(Path(root), keep=keep).save(step, write))
        dist.barrier()
        return path

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        if self.dist_cfg.strategy == "fsdp2":
            raise NotImplementedError("resuming an FSDP2 run is not supported yet; resume with strategy='ddp'")
        assert self.learner is not None, "setup first"
        extra = load_training_state(Path(path), unwrap(self.policy), self.optimizer)
        self.scheduler.load_state_dict(extra.pop("scheduler"))
        self.learner.algo.kl.value = float(extra.pop("kl_coef", self.learner.algo.kl.value))
        if self.learner.critic is not None:
            self.learner.critic.load(Path(path) / CRITIC_DIR)
        return extra

    # ------------------------------------------------------------------ weights to engines (rank 0)

    def _engine_state(self) -> dict[str, torch.Tensor]:
        """What the engines load: every weight, or with LoRA the merged adapted weights (a collective under FSDP2)."""
        model = unwrap(self.policy)
        if components.is_lora(model):
            return {k: v.detach().to("cpu", copy=True) for k, v in components.engine_weights(model).items()}
        return full_state_dict(self.policy)

    def weight_spec(self) -> comm.WeightSpec:
        return comm.weight_spec(self._engine_state())

    def join_weight_group(self, addr: str, port: int, size: int) -> None:
        dc = self.dist_cfg
        self._weights_group = comm.BroadcastGroup.join(dc.backend, addr, port, 0, size, dc.timeout_s)

    def broadcast_weights(self) -> None:
        """Send the weights to the engines' group and keep them: a restarted engine loads this copy."""
        state = self._engine_state()  # a collective under FSDP2: call on every rank
        if self.rank != 0:
            return
        assert self._weights_group is not None, "join_weight_group first"
        comm.send_state(self._weights_group, state, self.device)
        self._synced_state = state

    def synced_weights(self) -> dict[str, torch.Tensor]:
        """The weights of the engines' current version (the last broadcast)."""
        return self._synced_state

    def save_weights(self, path: str) -> str | None:
        """Write the weights to `path` (one safetensors file, atomically); rank 0 writes, every rank joins."""
        from safetensors.torch import save_file

        state = self._engine_state()
        if self.rank != 0:
            return None
        self._synced_state = state
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".tmp_{target.name}")
        save_file(state, str(tmp))
        os.replace(tmp, target)
        return str(target)

    # ------------------------------------------------------------------ consistency guards (rank 0)

    def synced_checksums(self, dtypes: dict[str, str]) -> dict[str, int]:
        """Exact checksums (assembly/guards.py) of the weights last sent to the engines, each in the engine's dtype."""
        return {
            name: checksum(tensor, getattr(torch, dtypes[name]) if name in dtypes else None)
            for name, tensor in self._synced_state.items()
        }

    @torch.no_grad()
    def score(self, ids: list[int]) -> list[float]:
        """The trainer's logprob of each next token of `ids` (the parity probe's scoring)."""
        model = unwrap(self.policy)
        was_training = model.training
        model.eval()
        try:
            tensor = torch.tensor([ids], device=self.device)
            logp, _ = token_logprobs(model, tensor, torch.ones_like(tensor), 1.0)
        finally:
            model.train(was_training)
        return logp[0].double().cpu().tolist()

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
from thermik.distributed.rank_state import RankState
from thermik.distributed.sharding import Shard, merge_metrics, shard_batch
from thermik.training.batch import TokenBatch, token_logprobs
from thermik.training.learner import Learner, build_learner, train_on_batch
from thermik.training.optim import build_optimizer
from thermik.training.run_checkpoint import CheckpointWriteFailure, restore, write_checkpoint


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
        self.learner.state_view = RankState(self.policy, self.optimizer, self.rank, dc.strategy == "fsdp2")
        return os.getpid()

    # ------------------------------------------------------------------ training

    def update(
        self, batch: TokenBatch, step: int, asynchronous: bool = False, cfg: RunConfig | None = None
    ) -> dict[str, float]:
        """The learner step of every run mode on the whole batch (this rank trains its shard). asynchronous: the batch
        was sampled by older weights (asynchronous training). cfg: this update's config instead of the run's (the
        same model; tests vary the reduction and mini-batches)."""
        assert self.learner is not None, "setup first"
        if cfg is not None:
            self.learner.cfg = self.share.cfg = cfg
        for name, value in batch.__dict__.items():
            if value is not None:
                setattr(batch, name, value.to(self.device))
        metrics, _ = asyncio.run(train_on_batch(self.learner, batch, step, asynchronous=asynchronous))
        return metrics

    def grads(self) -> dict[str, torch.Tensor]:
        return full_grads(self.policy)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return full_state_dict(self.policy)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, step: int, extra: dict[str, Any]) -> str | CheckpointWriteFailure | None:
        """Every rank joins (FSDP2 gathers shards); rank 0 writes checkpoints/step_<step> with the one writer of
        every mode and returns its path, or the failure of its write (the driver applies checkpoint.on_write_error);
        the other ranks return None."""
        assert self.learner is not None, "setup first"
        try:
            path = write_checkpoint(self.learner, step, extra)
        except CheckpointWriteFailure as failure:
            failure.__cause__ = None  # the driver needs the message; the cause may not pickle
            return failure
        return None if path is None else str(path)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Every rank loads checkpoint `path` (DDP: the whole model; FSDP2: its shards of it)."""
        assert self.learner is not None, "setup first"
        extra = restore(self.learner, Path(path))
        assert extra is not None
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

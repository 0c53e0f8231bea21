"""One data-parallel trainer rank, run as a Ray actor: holds the wrapped policy and runs policy_update on its shard.

The class is plain Python (Ray wraps it with `ray.remote` in launch.py), so it imports without Ray.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from thermik.assembly import components
from thermik.config.schema import AlgorithmConfig, DistributedConfig, RunConfig, TrainerConfig
from thermik.distributed import comm
from thermik.distributed.parallel import full_grads, full_state_dict, unwrap, wrap_policy
from thermik.distributed.sharding import Shard
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state
from thermik.training.loss import LossSetup
from thermik.training.optim import build_optimizer
from thermik.training.precision import autocast_dtype
from thermik.training.update import policy_update


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


class TrainerWorker:
    """Rank `rank` of `world_size`; `setup` joins the process group and wraps the policy (all ranks at once)."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.dist_cfg: DistributedConfig = cfg.distributed
        components.seed_everything(cfg.seed)
        self.model, self.chat = components.load_policy(cfg.model)
        self.autocast = autocast_dtype(cfg.model, self.model)
        self.ref: torch.nn.Module | None = None
        if cfg.algorithm.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        self._weights_group: comm.BroadcastGroup | None = None
        self._synced_state: dict[str, torch.Tensor] = {}

    def endpoint(self) -> tuple[str, int]:
        return comm.endpoint()

    def setup(self, addr: str, port: int) -> int:
        dc = self.dist_cfg
        comm.init_default_group(dc.backend, self.rank, self.world_size, addr, port, dc.timeout_s)
        self.device = comm.device_for(dc.backend, self.cfg.model.device)
        self.model.to(self.device)
        if self.ref is not None:
            self.ref.to(self.device)
        self.policy, self.optimizer, self.scheduler = wrap_policy(
            self.model, dc.strategy, self.device, lambda m: build_optimizer(m, self.cfg.trainer.optimizer)
        )
        return os.getpid()

    # ------------------------------------------------------------------ training

    def update(
        self, shard: Shard, alg: AlgorithmConfig, trainer: TrainerConfig, temperature: float
    ) -> dict[str, float]:
        """policy_update on this rank's shard; gradients are scaled (shard.grad_scales) and averaged across ranks."""
        batch = shard.batch
        for name, value in batch.__dict__.items():
            if value is not None:
                setattr(batch, name, value.to(self.device))
        self.policy.set_grad_scales(shard.grad_scales)
        setup = LossSetup.from_config(alg, trainer, temperature, autocast=self.autocast)
        return policy_update(self.policy, self.ref, batch, setup, self.optimizer, self.scheduler)

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
        extra = {**extra, "scheduler": self.scheduler.state_dict()}
        path = None
        if self.rank == 0:
            manager = CheckpointManager(Path(root), keep=keep)
            path = str(manager.save(step, lambda d: save_training_state(d, model, optimizer, step, extra=extra)))
        dist.barrier()
        return path

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        if self.dist_cfg.strategy == "fsdp2":
            raise NotImplementedError("resuming an FSDP2 run is not supported yet; resume with strategy='ddp'")
        extra = load_training_state(Path(path), unwrap(self.policy), self.optimizer)
        self.scheduler.load_state_dict(extra.pop("scheduler"))
        return extra

    # ------------------------------------------------------------------ weights to engines (rank 0)

    def weight_spec(self) -> comm.WeightSpec:
        return comm.weight_spec(unwrap(self.policy).state_dict())

    def join_weight_group(self, addr: str, port: int, size: int) -> None:
        dc = self.dist_cfg
        self._weights_group = comm.BroadcastGroup.join(dc.backend, addr, port, 0, size, dc.timeout_s)

    def broadcast_weights(self) -> None:
        """Send the weights to the engines' group and keep them: a restarted engine loads this copy."""
        state = full_state_dict(self.policy)  # a collective under FSDP2: call on every rank
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

        state = full_state_dict(self.policy)
        if self.rank != 0:
            return None
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".tmp_{target.name}")
        save_file(state, str(tmp))
        os.replace(tmp, target)
        return str(target)

"""A data-parallel rank's view of the policy and optimizer for the one checkpoint writer (training/run_checkpoint.py).

DDP: every rank holds the whole model; rank 0 writes it. FSDP2: each rank holds shards, so writing gathers the full
weights and the full optimizer state on every rank (collectives) and rank 0 writes them in the single-process
layout; resuming reads that layout on every rank and each keeps its own shards. Checkpoints are therefore the same
files in every mode and strategy: a run may resume under DDP, FSDP2 or in one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from thermik.distributed.parallel import ShardScaledPolicy, full_state_dict, unwrap
from thermik.training.checkpoint import MODEL_DIR, OPTIMIZER_FILE, load_training_state, read_model_weights


class _FullModel:
    """save_pretrained of an FSDP2 model from its gathered full state dict."""

    def __init__(self, model: Any, state: dict[str, torch.Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, path: Path) -> None:
        self.model.save_pretrained(path, state_dict=self.state)


class _FullOptimizer:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


class RankState:
    """The `TrainingStateView` of data-parallel rank `rank` (its policy wrapped for DDP, or sharded by FSDP2)."""

    def __init__(self, policy: ShardScaledPolicy, optimizer: torch.optim.Optimizer, rank: int, fsdp2: bool) -> None:
        self.policy, self._optimizer, self.fsdp2 = policy, optimizer, fsdp2
        self.writes = rank == 0

    def model(self) -> Any:
        if not self.fsdp2:
            return unwrap(self.policy)
        return _FullModel(unwrap(self.policy), full_state_dict(self.policy))

    def optimizer(self) -> Any:
        if not self.fsdp2:
            return self._optimizer
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = _full_options()
        return _FullOptimizer(get_optimizer_state_dict(unwrap(self.policy), self._optimizer, options=full))

    def load(self, directory: Path) -> dict[str, Any]:
        if not self.fsdp2:
            return load_training_state(directory, unwrap(self.policy), self._optimizer)
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        module = unwrap(self.policy)
        weights = read_model_weights(directory / MODEL_DIR)
        result = set_model_state_dict(module, weights, options=_full_options(strict=False))
        _check_only_tied_missing(module, result.missing_keys, weights)
        saved = torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(module, self._optimizer, saved, options=_full_options())
        return load_training_state(directory, None, None)  # RNG states and extras

    def written(self) -> None:
        dist.barrier()


def _full_options(strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, strict=strict)


def _check_only_tied_missing(module: torch.nn.Module, missing: list[str], loaded: dict[str, torch.Tensor]) -> None:
    """A weight absent from the file is fine only when it is tied to one that was loaded (lm_head = embed_tokens)."""
    names_of: dict[int, set[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), set()).add(name)
    params = dict(module.named_parameters(remove_duplicate=False))
    untied = [k for k in missing if k not in params or not (names_of[id(params[k])] & loaded.keys())]
    if untied:
        raise RuntimeError(f"the checkpoint's weights do not match the model: missing {untied[:5]}")

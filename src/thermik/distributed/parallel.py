"""Wrap a policy for data parallelism (DDP or FSDP2) so `policy_update` runs unchanged on a shard.

The wrapper scales the gradient flowing back into the logits by the shard's scale (sharding.py): every loss
term policy_update builds (policy loss, KL, entropy) is a function of the logits, so scaling that one
gradient scales all parameter gradients, before DDP/FSDP2 average them across ranks. The scale changes per
mini-batch; an optimizer step hook advances it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

Strategy = Literal["ddp", "fsdp2"]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by `scale` on the way back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class ShardScaledPolicy(torch.nn.Module):
    """A (DDP/FSDP2-wrapped) causal LM whose logits carry the shard's gradient scale for the current mini-batch."""

    def __init__(self, parallel_model: torch.nn.Module) -> None:
        super().__init__()
        self.parallel_model = parallel_model
        self._scales: tuple[float, ...] = (1.0,)
        self._mini_batch = 0

    @property
    def config(self) -> Any:
        """The HF model's config (the forward paths read its attention implementation, e.g. to pack rows)."""
        parallel = self.parallel_model
        return (parallel.module if hasattr(parallel, "module") else parallel).config

    def set_grad_scales(self, scales: Sequence[float]) -> None:
        """One scale per mini-batch of the coming policy_update call."""
        self._scales = tuple(float(s) for s in scales)
        self._mini_batch = 0

    def advance_mini_batch(self) -> None:
        self._mini_batch += 1

    def forward(self, **kwargs: Any) -> Any:
        out = self.parallel_model(**kwargs)
        if torch.is_grad_enabled():
            scale = self._scales[min(self._mini_batch, len(self._scales) - 1)]
            out.logits = _ScaleGrad.apply(out.logits, scale)
        return out


def wrap_policy(
    model: torch.nn.Module, strategy: Strategy, device: torch.device, optimizer_factory: Any
) -> tuple[ShardScaledPolicy, torch.optim.Optimizer, Any]:
    """Wrap `model` (already on `device`, process group initialised) and build its optimizer after wrapping
    (FSDP2 replaces parameters by DTensor shards). Returns (policy, optimizer, scheduler)."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        parallel = DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)  # buffers never change
        inner = model
    elif strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        parallel = inner = model
    else:
        raise ValueError(f"unknown data-parallel strategy {strategy!r}; valid: 'ddp', 'fsdp2'")
    optimizer, scheduler = optimizer_factory(inner)
    policy = ShardScaledPolicy(parallel)
    optimizer.register_step_post_hook(lambda *_: policy.advance_mini_batch())
    return policy, optimizer, scheduler


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HF causal LM (sharded one by one so FSDP2 gathers one block at a time)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return list(layers) if layers is not None else []


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 DTensor shard (a collective), the tensor itself otherwise."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def unwrap(policy: ShardScaledPolicy) -> torch.nn.Module:
    """The HF model inside (for save_pretrained and state dicts)."""
    parallel = policy.parallel_model
    return parallel.module if hasattr(parallel, "module") else parallel


def full_state_dict(policy: ShardScaledPolicy) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors of every weight; a collective under FSDP2, so every rank must call it."""
    return {name: _full(t).detach().to("cpu", copy=True) for name, t in unwrap(policy).state_dict().items()}


def full_grads(policy: ShardScaledPolicy) -> dict[str, torch.Tensor]:
    """Full gradients after an update, by parameter name (a collective under FSDP2)."""
    params = unwrap(policy).named_parameters()
    return {name: _full(p.grad).detach().to("cpu", copy=True) for name, p in params if p.grad is not None}

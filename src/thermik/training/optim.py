"""AdamW with linear warm-up then a constant rate.

AdamW runs torch's fused kernel where every parameter is a plain CPU or CUDA tensor: one vectorized, multi-threaded
pass per tensor instead of a dozen temporaries per tensor (SmolLM2-135M: ~0.05 s against ~0.3-0.8 s per step on the
2-core CPU, where the temporaries for the 28M-entry embedding each page-fault fresh memory). Sharded (DTensor)
parameters keep the default implementation."""

from __future__ import annotations

import torch

from thermik.config.schema import OptimizerConfig


def build_optimizer(
    model: torch.nn.Module, cfg: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=_fusable(params))
    warmup = max(cfg.warmup_steps, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warmup + 1)) if warmup else 1.0)
    return opt, sched


def _fusable(params: list[torch.Tensor]) -> bool | None:
    """True where torch's fused AdamW applies (plain CPU/CUDA float tensors); None keeps torch's default."""
    plain = all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
    return True if params and plain else None

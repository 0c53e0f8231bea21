"""AdamW with linear warm-up, then a constant rate or a linear decay.

AdamW runs torch's fused kernel where every parameter is a plain CPU or CUDA tensor: one vectorized, multi-threaded
pass per tensor instead of a dozen temporaries per tensor (on CPU the temporaries for a large embedding each
page-fault fresh memory; `benchmarks/trainer_mfu.py --before` measures the difference). Sharded (DTensor)
parameters keep the default implementation."""

from __future__ import annotations

import torch

from thermik.config.schema import OptimizerConfig


def build_optimizer(
    model: torch.nn.Module, cfg: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=_fusable(params))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))


def lr_factor(cfg: OptimizerConfig, step: int) -> float:
    """The rate of optimizer step `step` (from 0) relative to cfg.lr: linear warm-up, then constant or a linear
    decay to cfg.final_lr_ratio at cfg.decay_steps."""
    warmup = (step + 1) / (cfg.warmup_steps + 1) if cfg.warmup_steps else 1.0
    if cfg.decay_steps <= cfg.warmup_steps:
        return min(1.0, warmup)
    progress = min(1.0, max(0, step - cfg.warmup_steps) / (cfg.decay_steps - cfg.warmup_steps))
    return min(warmup, 1.0 - (1.0 - cfg.final_lr_ratio) * progress)


def _fusable(params: list[torch.Tensor]) -> bool | None:
    """True where torch's fused AdamW applies (plain CPU/CUDA float tensors); None keeps torch's default."""
    plain = all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
    return True if params and plain else None

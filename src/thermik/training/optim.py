"""AdamW with linear warm-up then a constant rate."""

from __future__ import annotations

import torch

from thermik.config.schema import OptimizerConfig


def build_optimizer(
    model: torch.nn.Module, cfg: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    warmup = max(cfg.warmup_steps, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warmup + 1)) if warmup else 1.0)
    return opt, sched

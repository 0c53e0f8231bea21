"""The decoder shape thermik's own forwards understand (Qwen2, Qwen3, Llama): which HF models qualify, and the
rotary position embedding and RMSNorm they share. Used by the engine's native forward (inference/native_model.py)
and the shared-prompt training forward (training/shared_prefix.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run on thermik's own forwards (None if it can)."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])
    ):
        return "sliding-window attention layers"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    return None


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model itself: under a PEFT wrapper its base model (whose submodules carry the adapters), else `model`.
    Recognises the wrapper by its method, so the core path needs no peft (an optional extra)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def rms_norm(x: Tensor, norm: torch.nn.Module) -> Tensor:
    """The model's RMSNorm module (Llama/Qwen2/Qwen3: `weight * x / rms(x)`) as one fused op: the HF module runs five
    elementwise passes forward and as many backward."""
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding (Su et al. 2021) in the HF "rotate half" layout: x [..., D], cos/sin broadcast."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

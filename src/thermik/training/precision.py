"""Mixed-precision training (`model.train_precision`): float32 master weights, bfloat16 arithmetic.

"bf16-mixed" runs the training forward under `torch.autocast(device, torch.bfloat16)`: matrix products and attention
take bfloat16 copies of their inputs (a weight that requires grad is cast once per forward, then cached; autocast's
backward returns float32 gradients to it), everything else stays float32. The parameters, their gradients and the
AdamW state are float32, so a step smaller than bfloat16's resolution of a weight (2^-8 relative) is not lost, as it
would be with `model.dtype = "bfloat16"`. The logits are cast to float32 before every log-softmax and entropy
(`batch.token_logprobs`, `shared_prefix.token_logprobs_shared`): logprob differences and PPO ratios of
near-equal values stay exact to float32 rounding. Backward runs outside the autocast region, as torch recommends.

"auto" (the default) reuses the engine's rule (`inference.precision.resolve_precision`): bf16-mixed where the CPU
reports AMX-BF16 or AVX512-BF16 or the GPU supports bfloat16, else float32; a model loaded in another dtype
(`model.dtype`) trains in that dtype. The trainer prints which one runs and why.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import torch

from thermik.config.schema import ModelConfig
from thermik.inference.precision import resolve_precision

TRAIN_PRECISIONS: tuple[str, ...] = ("float32", "bf16-mixed", "auto")

log = logging.getLogger(__name__)


def resolve_train_precision(
    name: str, device: torch.device, model_dtype: str = "float32"
) -> tuple[torch.dtype | None, str]:
    """(autocast dtype, reason): torch.bfloat16 for mixed precision, None for plain training in the model's dtype."""
    if name not in TRAIN_PRECISIONS:
        raise ValueError(f"unknown train precision {name!r}; valid precisions: {', '.join(TRAIN_PRECISIONS)}")
    if name == "float32":
        return None, "train_precision 'float32'"
    if name == "bf16-mixed":
        return torch.bfloat16, "train_precision 'bf16-mixed' was asked for"
    if model_dtype != "float32":
        return None, f"train_precision 'auto' with model.dtype {model_dtype!r} trains in {model_dtype}"
    dtype, reason = resolve_precision("auto", torch.float32, device)
    return (torch.bfloat16 if dtype == torch.bfloat16 else None), reason


def autocast_dtype(cfg: ModelConfig) -> torch.dtype | None:
    """The trainer's autocast dtype for `cfg` (None: the model's own dtype); says which and why on stderr."""
    dtype, reason = resolve_train_precision(cfg.train_precision, torch.device(cfg.device), cfg.dtype)
    line = f"thermik trainer: {'bf16-mixed' if dtype is not None else cfg.dtype} ({reason})"
    log.info(line)
    print(line, file=sys.stderr)
    return dtype


def device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


@contextlib.contextmanager
def train_autocast(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Autocast to `dtype` on the model's device for a forward pass; a no-op when dtype is None."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type(model), dtype=dtype):
        yield

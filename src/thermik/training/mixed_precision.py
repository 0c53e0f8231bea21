"""Mixed-precision training (`model.train_precision`): float32 master weights, bfloat16 arithmetic.

"bf16-mixed" runs the training forward under `torch.autocast(device, torch.bfloat16)`: matrix products and attention
take bfloat16 copies of their inputs (a weight that requires grad is cast once per forward, then cached; autocast's
backward returns float32 gradients to it), everything else stays float32. The parameters, their gradients and the
AdamW state are float32, so a step smaller than bfloat16's resolution of a weight (2^-8 relative) is not lost, as it
would be with `model.dtype = "bfloat16"`. Log-softmax and entropy read the logits as they are, in float32
arithmetic (`vocab_logprobs.py`): logprob differences and PPO ratios of near-equal values stay exact to float32
rounding of those logits. Backward runs outside the autocast region, as torch recommends.

The output projection can run outside autocast (`model.lm_head_precision`): float32 logits from the float32 master
weight. bfloat16 logits carry 8 bits of mantissa (a logit of 12 is rounded to a multiple of 1/16) and the
gradients that leave the lm head are rounded alike; on the calculator's 1M-parameter model, bf16-mixed SFT with a
bfloat16 lm head reached 0.035 and 0.30 held-out success after 1090 steps (seeds 0 and 1), float32 0.47 and 0.64,
bf16-mixed with a float32 lm head 0.555 and 0.565. MiniMax-M1 (2025) raised its LM head to float32 for the same
reason in RL (training/inference probability mismatch). It costs a float32 product of the head's size: on
SmolLM2-135M, whose head (tied to the 49152-token embedding) holds 21% of the parameters, the plain forward and
backward is markedly slower with it (benchmarks/README.md, `trainer_mfu.py`). "auto" therefore takes float32 where
the head holds at most `FLOAT32_HEAD_MAX_SHARE` of the parameters (every byte-vocabulary preset), bf16 otherwise.

"auto" (the default) reuses the engine's rule for "auto" (`cpu/engine_precision.auto_dtype`): bf16-mixed where the CPU
reports AMX-BF16 or AVX512-BF16 or the GPU supports bfloat16, else float32; a model loaded in another dtype
(`model.dtype`) trains in that dtype. The trainer prints which one runs and why.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from thermik.config.schema import ModelConfig
from thermik.cpu.engine_precision import auto_dtype
from thermik.models.architecture import unwrapped

TRAIN_PRECISIONS: tuple[str, ...] = ("float32", "bf16-mixed", "auto")
FLOAT32_HEAD_MAX_SHARE = 0.10  # lm_head_precision "auto": float32 up to this share of the parameters

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
    dtype, reason = auto_dtype(device)
    return (torch.bfloat16 if dtype == torch.bfloat16 else None), reason


def autocast_dtype(cfg: ModelConfig, model: torch.nn.Module | None = None) -> torch.dtype | None:
    """The trainer's autocast dtype for `cfg` (None: the model's own dtype); under bf16-mixed also sets `model`'s lm
    head precision (`cfg.lm_head_precision`). Says which and why on stderr."""
    dtype, reason = resolve_train_precision(cfg.train_precision, torch.device(cfg.device), cfg.dtype)
    line = f"thermik trainer: {'bf16-mixed' if dtype is not None else cfg.dtype} ({reason})"
    if dtype is not None and model is not None:
        line += f"; lm head in {set_lm_head_precision(model, cfg.lm_head_precision)}"
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


class Float32LMHead(torch.nn.Linear):
    """An `nn.Linear` output projection that computes outside autocast: float32 input, float32 master weight,
    float32 logits. Swapped in as the module's class, so its parameters and state-dict keys stay the same."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), self.weight, self.bias)


def set_lm_head_precision(model: torch.nn.Module, precision: str) -> str:
    """Make `model`'s output projection float32 or leave it to autocast, per `precision` ("auto", "float32",
    "bf16"); returns which and why, for the trainer's log line."""
    base = unwrapped(model)
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if type(head) not in (torch.nn.Linear, Float32LMHead):
        return "autocast's dtype (no plain nn.Linear lm head to run in float32)"
    share = head.weight.numel() / sum(p.numel() for p in base.parameters())
    if precision == "auto":
        why = f"the lm head holds {share:.0%} of the parameters; auto takes float32 up to {FLOAT32_HEAD_MAX_SHARE:.0%}"
        precision = "float32" if share <= FLOAT32_HEAD_MAX_SHARE else "bf16"
    else:
        why = f"lm_head_precision {precision!r}"
    head.__class__ = Float32LMHead if precision == "float32" else torch.nn.Linear
    return f"{'float32' if precision == 'float32' else 'bfloat16'} ({why})"

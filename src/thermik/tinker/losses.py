"""Tinker's loss functions by name, computed by thermik's algorithm library and summed over tokens.

Tinker defines every built-in loss as a sum over all tokens of all datums (no mean), reported as `loss:sum`:

| name | inputs (per datum, length T) | per-token loss | thermik function |
|---|---|---|---|
| cross_entropy | target_tokens, weights | -weights * logp | `cross_entropy_loss` |
| importance_sampling | target_tokens, logprobs, advantages | -ratio * A | `importance_sampling_loss` |
| ppo | same + clip_low_threshold 0.8, clip_high_threshold 1.2 | -min(ratio A, clip(ratio) A) | `ppo_clip_loss` |
| cispo | same + clip thresholds (0.8, 1.2) | -sg(clip(ratio)) A logp | `cispo_loss` |
| dro | same + beta (required) | -(A logp - beta/2 (logp - old)^2) | `dro_loss` |

Any other name of `thermik.algorithms.registry.POLICY_LOSSES` works too, with the same inputs as
importance_sampling and the loss's own parameter names taken from `loss_fn_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from thermik.algorithms.is_losses import dro_loss
from thermik.algorithms.losses import NoParams
from thermik.algorithms.registry import POLICY_LOSS_PARAMS, POLICY_LOSSES

RL_INPUTS = ("target_tokens", "logprobs", "advantages")
TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")


class LossError(ValueError):
    """A loss name, config or input the server cannot use; the request fails as the user's error."""


@dataclass
class LossResult:
    loss: Tensor  # scalar, the sum over tokens (what is differentiated)
    per_token: Tensor  # [N, T] the summed terms, 0 off the mask
    metrics: dict[str, float]


def valid_names() -> list[str]:
    return sorted(set(TINKER_LOSSES) | set(POLICY_LOSSES))


def required_inputs(name: str) -> tuple[str, ...]:
    if name not in valid_names():
        raise LossError(f"unknown loss_fn {name!r}; valid: {', '.join(valid_names())}")
    return ("target_tokens",) if name == "cross_entropy" else RL_INPUTS


def _params(name: str, config: Mapping[str, float | str]) -> Any:
    """The parameters of loss `name` from a Tinker loss_fn_config: ratio thresholds, or the loss's own parameter
    names (`POLICY_LOSS_PARAMS`)."""
    params_type = POLICY_LOSS_PARAMS[name]
    fields = {f.name for f in dataclasses.fields(params_type)}
    unknown = sorted(set(config) - fields - {"clip_low_threshold", "clip_high_threshold", "beta"})
    if unknown:
        raise LossError(f"loss_fn_config keys {unknown} are not understood by {name!r}")
    values = {k: float(v) for k, v in config.items() if k in fields}
    low, high = float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))
    if not 0 < low <= 1 <= high:
        raise LossError(f"need 0 < clip_low_threshold <= 1 <= clip_high_threshold; got {low}, {high}")
    if name in ("ppo", "cispo"):
        values.update(clip_low=1.0 - low, clip_high=high - 1.0)
    return params_type(**values)


def _summing(store: list[Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """The Tinker reduction: sum of per-token values times the mask (weights for cross_entropy); keeps the terms."""

    def reduce(x: Tensor, mask: Tensor) -> Tensor:
        terms = torch.where(mask != 0, x, torch.zeros_like(x)) * mask
        store.append(terms)
        return terms.sum()

    return reduce


def compute_loss(
    name: str, config: Mapping[str, float | str], logp: Tensor, inputs: Mapping[str, Tensor], mask: Tensor
) -> LossResult:
    """Loss `name` on logp [N, T] (target-token logprobs, with gradient); `inputs` holds [N, T] tensors
    (weights, logprobs, advantages), `mask` is 1 on real positions and 0 on padding."""
    required_inputs(name)
    store: list[Tensor] = []
    reduce = _summing(store)
    if name == "cross_entropy":
        weights = inputs["weights"] * mask if "weights" in inputs else mask
        zeros = torch.zeros_like(logp)
        loss, metrics = POLICY_LOSSES["cross_entropy"](logp, zeros, zeros, weights, NoParams(), reduce)
    elif name == "dro":
        if "beta" not in config:
            raise LossError("loss 'dro' needs loss_fn_config['beta']")
        loss, metrics = dro_loss(logp, inputs["logprobs"], inputs["advantages"], mask, float(config["beta"]), reduce)
    else:
        fn = POLICY_LOSSES[name]
        loss, metrics = fn(logp, inputs["logprobs"], inputs["advantages"], mask, _params(name, config), reduce)
    return LossResult(loss, store[-1], metrics)

"""The per-micro-batch loss of the policy update: a `LossSetup` built once from config, and a pure function of the
micro-batch's tensors that returns `(loss, MicroMetrics)`.

The loss is normalised by counts of the whole mini-batch (tokens, sequences, prompts), so the gradient does not
depend on how the mini-batch is cut into micro-batches (`mini_batch_reduction`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from thermik.algorithms import registry
from thermik.algorithms.episodes import episode_row_weights, has_multi_row_episodes
from thermik.algorithms.losses import Reduction
from thermik.algorithms.off_policy import OffPolicyParams, off_policy_weights
from thermik.algorithms.reductions import prompt_weights, weighted_sequence_mean
from thermik.config.algorithm import CorrectionConfig, LossConfig
from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.training.batch import TokenBatch


def loss_params(loss: LossConfig) -> Any:
    """The chosen loss's own parameters (its dataclass beside it in thermik.algorithms) from `algorithm.loss`."""
    knobs = loss.model_dump(exclude={"type", "path"})
    return registry.POLICY_LOSS_PARAMS[loss.type](**knobs)


def correction_params(correction: CorrectionConfig) -> OffPolicyParams:
    """`algorithm.correction` as the off-policy weighting's parameters."""
    knobs = correction.model_dump()
    return OffPolicyParams(mode=knobs.pop("type"), **knobs)


@dataclass(frozen=True)
class LossSetup:
    """Everything the policy update reads from config, resolved once (functions looked up by name)."""

    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    params: Any  # the loss's own parameters type (registry.POLICY_LOSS_PARAMS)
    correction: OffPolicyParams
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-token KL estimator
    kl_coef: float  # the current KL weight (a controller's value)
    kl_in_loss: bool  # kl_mode "loss": the KL to a reference (when there is one) is a loss term
    entropy_coef: float
    reduction: str
    seq_norm_constant: float
    temperature: float
    micro_batch_size: int
    mini_batches: int
    max_grad_norm: float
    shared_prefix: bool
    max_nonfinite_steps: int
    reduce_fn: Callable[..., torch.Tensor] = field(repr=False)
    packing: bool = True  # rows packed together where the shared-prompt forward does not apply (training/packing.py)
    autocast: torch.dtype | None = None  # bfloat16: the mixed-precision forward (mixed_precision.py); None: float32

    @classmethod
    def from_config(
        cls,
        alg: AlgorithmConfig,
        trainer: TrainerConfig,
        temperature: float,
        kl_coef: float | None = None,
        autocast: torch.dtype | None = None,
    ) -> LossSetup:
        """kl_coef: the current KL weight; None uses alg.kl.coef. autocast: `precision.autocast_dtype(model cfg)`."""
        return cls(
            policy_loss=registry.policy_loss(alg.loss.type, getattr(alg.loss, "path", "")),
            params=loss_params(alg.loss),
            correction=correction_params(alg.correction),
            kl=registry.get("kl", alg.kl.estimator),
            kl_coef=alg.kl.coef if kl_coef is None else kl_coef,
            kl_in_loss=alg.kl.mode == "loss",
            entropy_coef=alg.entropy_coef,
            reduction=alg.reduction.type,
            seq_norm_constant=alg.reduction.constant,
            temperature=temperature,
            micro_batch_size=trainer.micro_batch_size,
            mini_batches=trainer.mini_batches,
            max_grad_norm=trainer.optimizer.max_grad_norm,
            shared_prefix=trainer.shared_prefix,
            packing=trainer.packing,
            max_nonfinite_steps=alg.health.max_nonfinite_steps,
            reduce_fn=registry.get("reduction", alg.reduction.type),
            autocast=autocast,
        )


def mini_batch_reduction(setup: LossSetup, mini: TokenBatch) -> Callable[[int, int], Reduction]:
    """The reduction for rows [start, end) of `mini`, bound to counts of the whole mini-batch. Where an episode
    trains as several rows, the per-sequence reductions count episodes, not rows (docs/algorithms.md)."""
    fn = setup.reduce_fn
    if setup.reduction != "token_mean" and has_multi_row_episodes(mini.episode_ids):
        return _episode_reduction(setup, mini)
    if setup.reduction == "token_mean":
        return lambda s, e: partial(fn, normalizer=max(mini.num_tokens, 1))
    if setup.reduction == "prompt_mean":
        if mini.group_ids is None:
            raise ValueError("reduction prompt_mean needs the batch's group_ids (collate sets them)")
        weights = prompt_weights(mini.group_ids)
        return lambda s, e: partial(fn, seq_weights=weights[s:e])
    if setup.reduction == "seq_mean_token_sum_norm":
        return lambda s, e: partial(fn, num_sequences=len(mini), constant=setup.seq_norm_constant)
    return lambda s, e: partial(fn, num_sequences=len(mini))


def _episode_reduction(setup: LossSetup, mini: TokenBatch) -> Callable[[int, int], Reduction]:
    """sequence_mean / prompt_mean: each episode's token mean (over all its rows), averaged over episodes (or over
    each prompt's episodes, then prompts); seq_mean_token_sum_norm: token sums / (constant * episodes)."""
    assert mini.episode_ids is not None
    if setup.reduction == "seq_mean_token_sum_norm":
        episodes = len(torch.unique(mini.episode_ids))
        return lambda s, e: partial(setup.reduce_fn, num_sequences=episodes, constant=setup.seq_norm_constant)
    per_prompt = setup.reduction == "prompt_mean"
    weights = episode_row_weights(mini.episode_ids, mini.mask.sum(dim=-1), mini.group_ids, per_prompt=per_prompt)
    return lambda s, e: partial(weighted_sequence_mean, seq_weights=weights[s:e])


def _weighted(reduce: Reduction, weight: torch.Tensor) -> Reduction:
    """The reduction of x * weight: off-policy correction as a per-token loss weight."""
    return lambda x, mask: reduce(x * weight, mask)


@dataclass(frozen=True)
class MicroMetrics:
    """One micro-batch's measurements: masked token sums, and per-token means (`means`) weighted by `tokens`."""

    tokens: float
    entropy_sum: float
    mismatch_sum: float  # |behaviour - rollout logprob| summed over the mask
    kl_sum: float | None  # None without a KL loss term
    means: dict[str, float]  # the loss's and the off-policy correction's metrics (policy/ratio_std, ...)


def micro_batch_loss(
    setup: LossSetup, mb: TokenBatch, logp: torch.Tensor, entropy: torch.Tensor, reduce: Reduction
) -> tuple[torch.Tensor, MicroMetrics]:
    """Policy loss (+ KL to `mb.ref_logp` when set, - entropy bonus) of one micro-batch; logp/entropy [B, L-1].

    The behaviour logprobs are `mb.old_logp`, or this forward's detached `logp` (one optimizer step per batch:
    the behaviour policy is the current one). `reduce` is bound to the whole mini-batch's counts.
    """
    old = logp.detach() if mb.old_logp is None else mb.old_logp
    weight, op_metrics = off_policy_weights(old, mb.rollout_logp, mb.mask, setup.correction)
    loss_reduce = reduce if setup.correction.mode == "none" else _weighted(reduce, weight)
    loss, m = setup.policy_loss(logp, old, mb.adv, mb.mask, setup.params, loss_reduce)
    kl_sum = None
    if mb.ref_logp is not None:
        kl = setup.kl(logp, mb.ref_logp)
        loss = loss + setup.kl_coef * reduce(kl, mb.mask)
        kl_sum = float((kl.detach() * mb.mask).sum())
    if setup.entropy_coef:
        loss = loss - setup.entropy_coef * reduce(entropy, mb.mask)
    metrics = MicroMetrics(
        tokens=float(mb.mask.sum()),
        entropy_sum=float((entropy.detach() * mb.mask).sum()),
        # Rollout vs trainer logprobs of the same weights: the behaviour logprobs when computed, else this
        # forward (identical to them on the first mini-batch, which is the only one when mini_batches = 1).
        mismatch_sum=float(((old.detach() - mb.rollout_logp).abs() * mb.mask).sum()),
        kl_sum=kl_sum,
        means={key: float(value) for key, value in {**m, **op_metrics}.items()},
    )
    return loss, metrics

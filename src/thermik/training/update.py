"""One policy update on a batch: mini-batches (optimizer steps) split into micro-batches (memory only).

The loss is normalised by counts of the whole mini-batch (tokens, sequences, prompts), so the gradient
does not depend on how the mini-batch is cut into micro-batches. An optimizer step whose loss or gradient
norm is NaN/inf is skipped (the parameters do not change); `NonFiniteGuard` fails the run after K in a row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import fields
from functools import partial

import torch

from thermik.algorithms import registry
from thermik.algorithms.health import NonFiniteGuard
from thermik.algorithms.losses import LossParams, Reduction
from thermik.algorithms.off_policy import OffPolicyParams, off_policy_weights
from thermik.algorithms.reductions import prompt_weights
from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.training.batch import TokenBatch, token_logprobs
from thermik.training.shared_prefix import token_logprobs_shared

PER_TOKEN_FIELDS = ("mask", "rollout_logp", "adv", "old_logp", "ref_logp", "token_rewards", "values", "returns")


def loss_params(alg: AlgorithmConfig) -> LossParams:
    return LossParams(**{f.name: getattr(alg, f.name) for f in fields(LossParams)})


def off_policy_params(alg: AlgorithmConfig) -> OffPolicyParams:
    return OffPolicyParams(
        alg.off_policy, alg.off_policy_level, alg.off_policy_form, alg.tis_cap, alg.mis_low, alg.mis_high
    )


def _micro_batches(batch: TokenBatch, size: int) -> list[tuple[int, TokenBatch]]:
    """(first row, micro-batch) pairs; each micro-batch drops its all-padding columns."""
    out = []
    for start in range(0, len(batch), size):
        mb = batch.slice(start, start + size)
        width = int(mb.attention_mask.sum(1).max().item())
        mb.input_ids, mb.attention_mask = mb.input_ids[:, :width], mb.attention_mask[:, :width]
        for name in PER_TOKEN_FIELDS:
            if getattr(mb, name) is not None:
                setattr(mb, name, getattr(mb, name)[:, : width - 1])
        out.append((start, mb))
    return out


def batch_logprobs(
    model: torch.nn.Module, mb: TokenBatch, temperature: float, shared_prefix: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [B, L-1] of the micro-batch: each shared prompt computed once when `shared_prefix` and the
    model allow it (equal on response positions; prompt positions are then 0), else the plain forward."""
    if shared_prefix and mb.prompt_lens is not None:
        out = token_logprobs_shared(model, mb.input_ids, mb.attention_mask, mb.prompt_lens, temperature)
        if out is not None:
            return out
    return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature)


@torch.no_grad()
def logprobs_no_grad(
    model: torch.nn.Module, batch: TokenBatch, size: int, temperature: float, shared_prefix: bool = True
) -> torch.Tensor:
    """Per-token logprobs [B, L-1] of `model` on the batch (response positions), micro-batch by micro-batch."""
    out = torch.zeros_like(batch.mask)
    for start in range(0, len(batch), size):
        out[start : start + size] = batch_logprobs(model, batch.slice(start, start + size), temperature, shared_prefix)[
            0
        ]
    return out


def _reduction(alg: AlgorithmConfig, mini: TokenBatch) -> Callable[[int, int], Reduction]:
    """The reduction for rows [start, end) of `mini`, bound to counts of the whole mini-batch."""
    fn = registry.get("reduction", alg.reduction)
    if alg.reduction == "token_mean":
        return lambda s, e: partial(fn, normalizer=max(mini.num_tokens, 1))
    if alg.reduction == "prompt_mean":
        if mini.group_ids is None:
            raise ValueError("reduction prompt_mean needs the batch's group_ids (collate sets them)")
        weights = prompt_weights(mini.group_ids)
        return lambda s, e: partial(fn, seq_weights=weights[s:e])
    if alg.reduction == "seq_mean_token_sum_norm":
        return lambda s, e: partial(fn, num_sequences=len(mini), constant=alg.seq_norm_constant)
    return lambda s, e: partial(fn, num_sequences=len(mini))


def _weighted(reduce: Reduction, weight: torch.Tensor) -> Reduction:
    """The reduction of x * weight: off-policy correction as a per-token loss weight."""
    return lambda x, mask: reduce(x * weight, mask)


def policy_update(
    policy: torch.nn.Module,
    ref: torch.nn.Module | None,
    batch: TokenBatch,
    alg: AlgorithmConfig,
    trainer: TrainerConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    temperature: float,
    kl_coef: float | None = None,
    guard: NonFiniteGuard | None = None,
    rollout_is_behaviour: bool = False,
) -> dict[str, float]:
    """kl_coef: the current KL weight (a controller's value); None uses alg.kl_coef. guard: keeps the count of
    consecutive non-finite steps across calls; None counts within this call only. rollout_is_behaviour: the
    samples came from older weights (asynchronous training), so the ratio is taken against the rollout logprobs."""
    policy.train()
    loss_fn = registry.policy_loss(alg.loss, alg.custom_loss)
    kl_fn = registry.get("kl", alg.kl_estimator)
    params, correction = loss_params(alg), off_policy_params(alg)
    kl_coef = alg.kl_coef if kl_coef is None else kl_coef
    guard = guard or NonFiniteGuard(alg.max_nonfinite_steps)
    micro = trainer.micro_batch_size
    # With one optimizer step per batch the behaviour policy is the current one: old_logp = logp.detach().
    shared = trainer.shared_prefix
    old_all = logprobs_no_grad(policy, batch, micro, temperature, shared) if trainer.mini_batches > 1 else None
    if rollout_is_behaviour:
        old_all = batch.rollout_logp
    kl_in_loss = ref is not None and alg.kl_mode == "loss"
    ref_all = logprobs_no_grad(ref, batch, micro, temperature, shared) if kl_in_loss and ref is not None else None
    sums: dict[str, float] = defaultdict(float)
    per_mini = -(-len(batch) // trainer.mini_batches)
    for m_index, m_start in enumerate(range(0, len(batch), per_mini)):
        mini = batch.slice(m_start, m_start + per_mini)
        mini.old_logp = None if old_all is None else old_all[m_start : m_start + per_mini]
        mini.ref_logp = None if ref_all is None else ref_all[m_start : m_start + per_mini]
        reduction = _reduction(alg, mini)
        optimizer.zero_grad(set_to_none=True)
        mini_loss = 0.0
        for start, mb in _micro_batches(mini, micro):
            logp, entropy = batch_logprobs(policy, mb, temperature, shared)
            old = logp.detach() if mb.old_logp is None else mb.old_logp
            weight, op_metrics = off_policy_weights(old, mb.rollout_logp, mb.mask, correction)
            reduce = reduction(start, start + len(mb))
            loss_reduce = reduce if correction.mode == "none" else _weighted(reduce, weight)
            loss, m = loss_fn(logp, old, mb.adv, mb.mask, params, loss_reduce)
            if mb.ref_logp is not None:
                kl = kl_fn(logp, mb.ref_logp)
                loss = loss + kl_coef * reduce(kl, mb.mask)
                sums["policy/kl"] += float((kl.detach() * mb.mask).sum())
            if alg.entropy_coef:
                loss = loss - alg.entropy_coef * reduce(entropy, mb.mask)
            loss.backward()
            mini_loss += float(loss.detach())
            n = float(mb.mask.sum())
            sums["policy/entropy"] += float((entropy.detach() * mb.mask).sum())
            # Rollout vs trainer logprobs of the same weights: the behaviour logprobs when computed, else this
            # forward (identical to them on the first mini-batch, which is the only one when mini_batches = 1).
            sums["mismatch/logprob_abs_diff"] += float(((old.detach() - mb.rollout_logp).abs() * mb.mask).sum())
            for key, value in {**m, **op_metrics}.items():
                sums[key] += float(value) * n
            if m_index > 0:  # the policy has stepped on this batch: the ratio now measures the update
                sums["health/ratio_std_updated"] += float(m["policy/ratio_std"]) * n
                sums["health/ratio_updated_tokens"] += n
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), trainer.optimizer.max_grad_norm))
        if guard.ok(mini_loss, grad_norm):
            optimizer.step()
            scheduler.step()
            sums["policy/grad_norm"] += grad_norm / trainer.mini_batches
        else:  # a NaN/inf step is not taken: parameters, optimizer state and schedule stay as they were
            optimizer.zero_grad(set_to_none=True)
            sums["health/skipped_steps"] += 1
        sums["policy/loss"] += mini_loss / trainer.mini_batches
    return _finish_metrics(sums, max(batch.num_tokens, 1), scheduler.get_last_lr()[0])


def _finish_metrics(sums: dict[str, float], total_tokens: int, lr: float) -> dict[str, float]:
    """Token-weighted sums -> means; loss, grad norm and skipped steps stay as accumulated."""
    as_is = ("policy/loss", "policy/grad_norm", "health/skipped_steps")
    out = {k: (v if k in as_is else v / total_tokens) for k, v in sums.items() if not k.startswith("health/ratio")}
    updated = sums.get("health/ratio_updated_tokens", 0.0)
    if updated:  # absent when no token was measured: nothing to conclude
        out["health/ratio_std_updated"] = sums["health/ratio_std_updated"] / updated
    out.setdefault("health/skipped_steps", 0.0)
    out.setdefault("policy/grad_norm", 0.0)
    out["policy/lr"] = lr
    return out

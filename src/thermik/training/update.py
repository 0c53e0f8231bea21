"""One policy update on a batch: mini-batches (optimizer steps) split into micro-batches (memory only).

The loss is normalised by the token (or sequence) count of the whole mini-batch, so the gradient
does not depend on how the mini-batch is cut into micro-batches.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial

import torch

from thermik.algorithms import registry
from thermik.algorithms.kl import kl_k3
from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.training.batch import TokenBatch, token_logprobs


def _micro_batches(batch: TokenBatch, size: int) -> list[TokenBatch]:
    out = []
    for start in range(0, len(batch), size):
        mb = batch.slice(start, start + size)
        width = int(mb.attention_mask.sum(1).max().item())  # drop all-padding columns
        mb.input_ids, mb.attention_mask = mb.input_ids[:, :width], mb.attention_mask[:, :width]
        for name in ("mask", "rollout_logp", "adv", "old_logp", "ref_logp"):
            if getattr(mb, name) is not None:
                setattr(mb, name, getattr(mb, name)[:, : width - 1])
        out.append(mb)
    return out


@torch.no_grad()
def _logprobs_no_grad(model: torch.nn.Module, batch: TokenBatch, size: int, temperature: float) -> torch.Tensor:
    out = torch.zeros_like(batch.mask)
    for start in range(0, len(batch), size):
        mb = batch.slice(start, start + size)
        out[start : start + size] = token_logprobs(model, mb.input_ids, mb.attention_mask, temperature)[0]
    return out


def policy_update(
    policy: torch.nn.Module,
    ref: torch.nn.Module | None,
    batch: TokenBatch,
    alg: AlgorithmConfig,
    trainer: TrainerConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    temperature: float,
    rollout_is_behaviour: bool = False,
) -> dict[str, float]:
    """One update. `rollout_is_behaviour`: the samples came from older weights (asynchronous training), so the
    PPO ratio is taken against the rollout logprobs rather than the current policy's."""
    policy.train()
    loss_fn = registry.get("policy_loss", alg.loss)
    reduce_fn = registry.get("reduction", alg.reduction)
    # With one optimizer step per batch the behaviour policy is the current one: old_logp = logp.detach().
    old_all = (
        batch.rollout_logp
        if rollout_is_behaviour
        else _logprobs_no_grad(policy, batch, trainer.micro_batch_size, temperature)
        if trainer.mini_batches > 1
        else None
    )
    ref_all = _logprobs_no_grad(ref, batch, trainer.micro_batch_size, temperature) if ref is not None else None
    sums: dict[str, float] = defaultdict(float)
    total_tokens = max(batch.num_tokens, 1)
    per_mini = -(-len(batch) // trainer.mini_batches)
    for m_start in range(0, len(batch), per_mini):
        mini = batch.slice(m_start, m_start + per_mini)
        mini.old_logp = None if old_all is None else old_all[m_start : m_start + per_mini]
        mini.ref_logp = None if ref_all is None else ref_all[m_start : m_start + per_mini]
        norm = {"token_mean": {"normalizer": max(mini.num_tokens, 1)}}.get(alg.reduction, {"num_sequences": len(mini)})
        reduce = partial(reduce_fn, **norm)
        optimizer.zero_grad(set_to_none=True)
        for mb in _micro_batches(mini, trainer.micro_batch_size):
            logp, entropy = token_logprobs(policy, mb.input_ids, mb.attention_mask, temperature)
            old = logp.detach() if mb.old_logp is None else mb.old_logp
            loss, m = loss_fn(logp, old, mb.adv, mb.mask, alg.clip_low, alg.clip_high, reduce)
            if mb.ref_logp is not None:
                kl = kl_k3(logp, mb.ref_logp)
                loss = loss + alg.kl_coef * reduce(kl, mb.mask)
                sums["policy/kl"] += float((kl.detach() * mb.mask).sum())
            if alg.entropy_coef:
                loss = loss - alg.entropy_coef * reduce(entropy, mb.mask)
            loss.backward()
            n = float(mb.mask.sum())
            sums["policy/loss"] += float(loss.detach())
            sums["policy/entropy"] += float((entropy.detach() * mb.mask).sum())
            # Rollout vs trainer logprobs of the same weights: the behaviour logprobs when computed, else this
            # forward (identical to them on the first mini-batch, which is the only one when mini_batches = 1).
            behaviour = old.detach()
            sums["mismatch/logprob_abs_diff"] += float(((behaviour - mb.rollout_logp).abs() * mb.mask).sum())
            for key in ("clip_frac", "ratio_mean", "ratio_std"):
                sums[f"policy/{key}"] += float(m[f"policy/{key}"]) * n
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), trainer.optimizer.max_grad_norm)
        sums["policy/grad_norm"] += float(grad_norm) / trainer.mini_batches
        optimizer.step()
        scheduler.step()
    out = {k: (v if k in ("policy/loss", "policy/grad_norm") else v / total_tokens) for k, v in sums.items()}
    out["policy/loss"] = sums["policy/loss"] / trainer.mini_batches
    out["policy/lr"] = scheduler.get_last_lr()[0]
    return out

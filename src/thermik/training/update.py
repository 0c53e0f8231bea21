"""One policy update on a batch: mini-batches (optimizer steps) split into micro-batches (memory only).

The loss of one micro-batch is `training.loss.micro_batch_loss`; this module holds the loop around it: mini-batches
-> micro-batches -> backward -> clip -> non-finite guard -> optimizer/scheduler step. An optimizer step whose loss
or gradient norm is NaN/inf is skipped (the parameters do not change); `NonFiniteGuard` fails the run after K in a
row.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from thermik.algorithms.health import NonFiniteGuard
from thermik.training.batch import TokenBatch, model_device, token_logprobs
from thermik.training.loss import LossSetup, MicroMetrics, micro_batch_loss, mini_batch_reduction
from thermik.training.mixed_precision import train_autocast
from thermik.training.packing import pack_for, packed_token_logprobs, unpack
from thermik.training.shared_prefix import token_logprobs_shared

PER_TOKEN_FIELDS = ("mask", "rollout_logp", "adv", "old_logp", "ref_logp", "token_rewards", "values", "returns")


def micro_batches(batch: TokenBatch, size: int) -> list[tuple[int, TokenBatch]]:
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
    model: torch.nn.Module,
    mb: TokenBatch,
    temperature: float,
    shared_prefix: bool = True,
    autocast: torch.dtype | None = None,
    entropy_grad: bool = True,
    packing: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [B, L-1] of the micro-batch: each shared prompt computed once when `shared_prefix` and the
    model allow it (equal on the trained positions, `mb.mask`; the others are then 0), else, with `packing`, the
    rows packed together where that takes fewer rows (training/packing.py; 0 after each sequence), else the padded
    forward. autocast: bfloat16 for mixed precision (training/mixed_precision.py); logp and entropy are float32 either
    way."""
    with train_autocast(model, autocast):
        if shared_prefix and mb.prompt_lens is not None:
            out = token_logprobs_shared(
                model, mb.input_ids, mb.attention_mask, mb.prompt_lens, temperature, entropy_grad, only=mb.mask
            )
            if out is not None:
                return out
        if packing:
            out = packed_rows_logprobs(model, mb, temperature, entropy_grad)
            if out is not None:
                return out
        return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature, entropy_grad)


def packed_rows_logprobs(
    model: torch.nn.Module, mb: TokenBatch, temperature: float, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(logp, entropy) of the right-padded micro-batch computed on packed rows as wide as its widest row; None when
    packing would not save a row."""
    lengths = mb.attention_mask.sum(dim=-1).tolist()
    width = mb.input_ids.shape[1]
    packed = pack_for(model, [mb.input_ids[i, : int(n)].tolist() for i, n in enumerate(lengths)], width, pad_id=0)
    if packed.rows >= len(mb):
        return None
    logp, entropy = packed_token_logprobs(model, packed, temperature, entropy_grad)
    return unpack(logp, packed, width), unpack(entropy, packed, width)


@torch.no_grad()
def logprobs_no_grad(
    model: torch.nn.Module,
    batch: TokenBatch,
    size: int,
    temperature: float,
    shared_prefix: bool = True,
    autocast: torch.dtype | None = None,
    packing: bool = True,
) -> torch.Tensor:
    """Per-token logprobs [B, L-1] of `model` on the batch (response positions), micro-batch by micro-batch, in the
    training forward's precision (so a behaviour logprob equals the first mini-batch's logp). Each micro-batch runs
    on the model's device; the result lies where the batch does."""
    out = torch.zeros_like(batch.mask)
    device = model_device(model)
    for start in range(0, len(batch), size):
        mb = batch.slice(start, start + size).to(device)
        out[start : start + size] = batch_logprobs(model, mb, temperature, shared_prefix, autocast, packing=packing)[0]
    return out


class UpdateMetrics:
    """The metrics of one `policy_update`, accumulated in one place. Reduction per key:

    - token mean over the batch: `policy/kl`, `policy/entropy`, `mismatch/logprob_abs_diff` and every metric of the
      loss and the off-policy correction (each micro-batch's mean weighted by its token count);
    - mean over mini-batches: `policy/loss`; `policy/grad_norm` of the steps taken (a skipped step adds 0);
    - count: `health/skipped_steps`;
    - token mean over mini-batches after the first: `health/ratio_std_updated` (the policy has stepped on this
      batch, so the ratio measures the update; absent with one mini-batch);
    - last value: `policy/lr`.
    """

    def __init__(self, mini_batches: int) -> None:
        self.mini_batches = mini_batches
        self.token_sums: dict[str, float] = {}
        self.loss = self.grad_norm = self.skipped_steps = 0.0
        self.ratio_std_updated = self.updated_tokens = 0.0

    def _add(self, key: str, value: float) -> None:
        self.token_sums[key] = self.token_sums.get(key, 0.0) + value

    def add_micro(self, m: MicroMetrics, policy_stepped: bool) -> None:
        if m.kl_sum is not None:
            self._add("policy/kl", m.kl_sum)
        self._add("policy/entropy", m.entropy_sum)
        self._add("mismatch/logprob_abs_diff", m.mismatch_sum)
        for key, value in m.means.items():
            self._add(key, value * m.tokens)
        if policy_stepped:
            self.ratio_std_updated += m.means["policy/ratio_std"] * m.tokens
            self.updated_tokens += m.tokens

    def add_step(self, loss: float, grad_norm: float, taken: bool) -> None:
        if taken:
            self.grad_norm += grad_norm / self.mini_batches
        else:
            self.skipped_steps += 1
        self.loss += loss / self.mini_batches

    def result(self, total_tokens: int, lr: float) -> dict[str, float]:
        out = {key: value / total_tokens for key, value in self.token_sums.items()}
        out["policy/grad_norm"] = self.grad_norm
        out["policy/loss"] = self.loss
        if self.updated_tokens:  # absent when no token was measured: nothing to conclude
            out["health/ratio_std_updated"] = self.ratio_std_updated / self.updated_tokens
        out["health/skipped_steps"] = self.skipped_steps
        out["policy/lr"] = lr
        return out


def _mini_batches(
    batch: TokenBatch, count: int, old_all: torch.Tensor | None, ref_all: torch.Tensor | None
) -> Iterator[TokenBatch]:
    """`count` mini-batches (the last may be shorter) carrying their rows of the behaviour and reference logprobs."""
    per_mini = -(-len(batch) // count)
    for start in range(0, len(batch), per_mini):
        mini = batch.slice(start, start + per_mini)
        mini.old_logp = None if old_all is None else old_all[start : start + per_mini]
        mini.ref_logp = None if ref_all is None else ref_all[start : start + per_mini]
        yield mini


def _backward(policy: torch.nn.Module, mini: TokenBatch, setup: LossSetup, acc: UpdateMetrics, stepped: bool) -> float:
    """Gradients of one mini-batch's loss, micro-batch by micro-batch; returns the loss."""
    reduction = mini_batch_reduction(setup, mini)
    mini_loss = 0.0
    for start, mb in micro_batches(mini, setup.micro_batch_size):
        logp, entropy = batch_logprobs(
            policy,
            mb,
            setup.temperature,
            setup.shared_prefix,
            setup.autocast,
            entropy_grad=bool(setup.entropy_coef),
            packing=setup.packing,
        )
        loss, metrics = micro_batch_loss(setup, mb, logp, entropy, reduction(start, start + len(mb)))
        loss.backward()
        mini_loss += float(loss.detach())
        acc.add_micro(metrics, stepped)
    return mini_loss


def _nonfinite_grad(policy: torch.nn.Module) -> str:
    """The name of the first parameter whose gradient holds NaN/inf (asked only when the norm is not finite)."""
    for name, param in policy.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            return f"first in {name}"
    return "norm"


def policy_update(
    policy: torch.nn.Module,
    ref: torch.nn.Module | None,
    batch: TokenBatch,
    setup: LossSetup,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    guard: NonFiniteGuard | None = None,
    asynchronous: bool = False,
) -> dict[str, float]:
    """guard: keeps the count of consecutive non-finite steps across calls; None counts within this call only.
    asynchronous: the samples came from older weights (asynchronous training), so the ratio is taken
    against the rollout logprobs."""
    policy.train()
    batch = batch.to(model_device(policy))  # collated on the CPU; the update runs where the policy lives
    guard = guard or NonFiniteGuard(setup.max_nonfinite_steps)
    fwd = (setup.micro_batch_size, setup.temperature, setup.shared_prefix, setup.autocast, setup.packing)
    # With one optimizer step per batch the behaviour policy is the current one: old_logp = logp.detach().
    old_all = batch.rollout_logp if asynchronous else None
    if not asynchronous and setup.mini_batches > 1:
        old_all = logprobs_no_grad(policy, batch, *fwd)
    ref_all = logprobs_no_grad(ref, batch, *fwd) if ref is not None and setup.kl_in_loss else None
    acc = UpdateMetrics(setup.mini_batches)
    for m_index, mini in enumerate(_mini_batches(batch, setup.mini_batches, old_all, ref_all)):
        optimizer.zero_grad(set_to_none=True)
        mini_loss = _backward(policy, mini, setup, acc, stepped=m_index > 0)
        params = [p for p in policy.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        grad_norm = float(norm)
        # The culprit is looked up before clipping: clipping by a NaN norm would make every gradient NaN.
        taken = guard.ok(mini_loss, grad_norm, "" if math.isfinite(grad_norm) else _nonfinite_grad(policy))
        if taken:
            torch.nn.utils.clip_grads_with_norm_(params, setup.max_grad_norm, norm)
            optimizer.step()
            scheduler.step()
        else:  # a NaN/inf step is not taken: parameters, optimizer state and schedule stay as they were
            optimizer.zero_grad(set_to_none=True)
        acc.add_step(mini_loss, grad_norm, taken)
    return acc.result(max(batch.num_tokens, 1), scheduler.get_last_lr()[0])

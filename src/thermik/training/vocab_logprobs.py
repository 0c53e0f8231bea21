"""Token logprobs and entropy over the vocabulary, in float32, without float32 copies of the logits.

A real model's logits are [tokens, vocabulary] = [2048, 49152] for a 8 x 256 batch of SmolLM2: 200 MB in bfloat16,
400 MB once cast to float32. `torch.log_softmax` on them writes a float32 [N, V] result, keeps it for backward and
then writes a float32 gradient and casts it back: four passes over 400 MB that miss every cache. Profiled on a 2-core
CPU, that vocabulary-sized float32 work was a large share of a bf16-mixed training step.

`VocabLogprobs` does the same arithmetic a row at a time and keeps only the logits (already alive in the graph, in
their own dtype) and two float32 numbers per row (log-normaliser, entropy) for backward, where it recomputes the
softmax. On CPU it runs the C kernels of `cpu/csrc/vocab.c` (each row read twice forward, once backward,
while it sits in L2; rows split over torch's thread count); elsewhere, or with THERMIK_CPU_KERNELS=0 or no C
compiler, the same arithmetic as PyTorch ops on blocks of ~4 MB. Results equal
`log_softmax(logits.float() / T).gather(targets)` and `-(p * log p).sum()` to float32 rounding; gradients too,
including the entropy's own gradient dH/dz = -p (log p + H) when an entropy bonus trains it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thermik.cpu.kernels import vocab_kernels_for

BLOCK_BYTES = 4 << 20  # float32 bytes of one block of rows on CPU: inside a core's share of L3 with room to spare
# On a GPU each block costs a few kernel launches and the float32 temporaries sit in device memory: far larger blocks.
DEVICE_BLOCK_BYTES = 256 << 20


def _scaled(logits: Tensor, inv_temp: float) -> Tensor:
    """logits * inv_temp as a fresh float32 block (safe to overwrite)."""
    z = logits.float() if logits.dtype != torch.float32 else logits.clone()
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


def _normalised(logits: Tensor, inv_temp: float) -> tuple[Tensor, Tensor]:
    """(z - logsumexp(z) as a fresh float32 block, logsumexp(z) [rows]) for z = logits * inv_temp."""
    z = _scaled(logits, inv_temp)
    lse = torch.logsumexp(z, dim=-1)
    return z.sub_(lse[:, None]), lse


def _blocks(batch: int, length: int, vocab: int, device: torch.device) -> list[tuple[int, slice]]:
    """(row, positions) blocks covering [batch, length] with about BLOCK_BYTES (DEVICE_BLOCK_BYTES off the CPU) of
    float32 logits each."""
    step = max(1, (BLOCK_BYTES if device.type == "cpu" else DEVICE_BLOCK_BYTES) // (4 * vocab))
    return [(b, slice(t, min(t + step, length))) for b in range(batch) for t in range(0, length, step)]


def _torch_forward(logits: Tensor, targets: Tensor, inv_temp: float, out: tuple[Tensor, Tensor, Tensor]) -> None:
    logp, entropy, lse = out
    for b, t in _blocks(*targets.shape, logits.shape[-1], logits.device):
        logp_all, lse[b, t] = _normalised(logits[b, t], inv_temp)
        logp[b, t] = logp_all.gather(-1, targets[b, t, None]).squeeze(-1)
        entropy[b, t] = -torch.linalg.vecdot(logp_all.exp(), logp_all)


def _torch_backward(
    saved: tuple[Tensor, ...], inv_temp: float, grads: tuple[Tensor, Tensor | None], out: Tensor
) -> None:
    logits, targets, lse, entropy = saved
    grad_logp, grad_entropy = grads
    for b, t in _blocks(*targets.shape, logits.shape[-1], logits.device):
        logp_all = _scaled(logits[b, t], inv_temp).sub_(lse[b, t, None])
        g = grad_logp[b, t, None]
        if grad_entropy is None:  # d logp_target / dz = onehot_target - p
            block = logp_all.exp_().mul_(-g)
        else:  # and dH/dz = -p (log p + H)
            p = logp_all.exp()
            block = p.mul_(logp_all.add_(entropy[b, t, None]).mul_(grad_entropy[b, t, None]).add_(g)).neg_()
        block.scatter_add_(-1, targets[b, t, None], g)
        out[b, t] = block.mul_(inv_temp) if inv_temp != 1.0 else block


def vocab_forward(logits: Tensor, targets: Tensor, inv_temp: float) -> tuple[Tensor, Tensor, Tensor]:
    """(logp, entropy, log-normaliser) [B, T] float32 of `targets` [B, T] (contiguous) under softmax(logits[:, :T] *
    inv_temp), logits [B, L >= T, V]."""
    out = tuple(torch.empty(targets.shape, dtype=torch.float32, device=logits.device) for _ in range(3))
    kernels = vocab_kernels_for(logits)
    (kernels.forward if kernels else _torch_forward)(logits, targets, inv_temp, out)
    return out


def vocab_backward(
    saved: tuple[Tensor, ...], inv_temp: float, grads: tuple[Tensor | None, Tensor | None], out: Tensor
) -> None:
    """The gradient for the logits' [B, T] rows into `out`, which may be the logits themselves, from (logits, targets,
    lse, entropy) and the gradients of (logp, entropy) (either may be None: zero)."""
    logits, lse = saved[0], saved[2]
    grad_logp, grad_entropy = grads
    grad_logp = torch.zeros_like(lse) if grad_logp is None else grad_logp.float().contiguous()
    grad_entropy = None if grad_entropy is None else grad_entropy.float().contiguous()
    kernels = vocab_kernels_for(logits)
    (kernels.backward if kernels else _torch_backward)(saved, inv_temp, (grad_logp, grad_entropy), out)


class VocabLogprobs(torch.autograd.Function):
    """(logp [B, T], entropy [B, T]) of `targets` [B, T] under softmax(logits[:, :T] * inv_temp), float32.
    logits [B, L, V] with L >= T: the caller's logits as the model returned them (slicing off the last position
    first would make autograd write a second [B, L, V] gradient to copy this one into)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, inv_temp: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        ctx.set_materialize_grads(False)
        targets = targets.contiguous()
        logp, entropy, lse = vocab_forward(logits, targets, inv_temp)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.inv_temp = inv_temp
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor, None, None]:  # type: ignore[override]
        saved = ctx.saved_tensors
        logits, targets = saved[:2]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad[:, targets.shape[1] :] = 0
        vocab_backward(saved, ctx.inv_temp, (grad_logp, grad_entropy), grad)
        return grad, None, None


def vocab_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """(logp [B, T] of `targets` [B, T], entropy [B, T]) under softmax(logits[:, :T] / temperature), float32;
    logits [B, L, V], L >= T, in float32 or bfloat16."""
    shapes_fit = logits.dim() == 3 and targets.dim() == 2 and targets.shape[0] == logits.shape[0]
    if not shapes_fit or targets.shape[1] > logits.shape[1]:
        raise ValueError(
            "vocab_logprobs: expected logits [B, L, V] and targets [B, T] with T <= L, got "
            f"{tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    return VocabLogprobs.apply(logits, targets, 1.0 / temperature)

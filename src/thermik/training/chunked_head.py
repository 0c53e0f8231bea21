"""The lm head, token logprobs and entropy over chunks of tokens, recomputed in backward: no [tokens, vocab] logits.

At Qwen's vocabulary (151,936) a 16 x 2,048-token micro-batch's logits are 10 GB in bfloat16, and autograd keeps
them (and writes their gradient) between forward and backward. `ChunkedHeadLogprobs` takes the final hidden states
[N, H] instead, and computes `CHUNK_ROWS` tokens' logits at a time: forward keeps only logp, entropy and the
log-normaliser per token; backward recomputes each chunk's logits, turns them into their gradient in place
(`vocab_backward`), and accumulates the hidden states' and the weight's gradients. Peak vocabulary memory is one
chunk's logits, for one more head matmul per chunk (the recompute). Values and gradients equal the full head's to
float rounding (tests/test_chunked_head.py; memory in benchmarks/chunked_head.py).

`token_logprobs_chunked` applies it to a whole model when the full logits would exceed `LOGITS_BUDGET_BYTES`; under
the budget (small vocabularies, short micro-batches) the plain forward is used.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from thermik.training.fused_head import head_dtype
from thermik.training.mixed_precision import Float32LMHead
from thermik.training.vocab_logprobs import vocab_backward, vocab_forward

LOGITS_BUDGET_BYTES = 1 << 30  # float32 bytes of a forward's full logits above which the head runs in chunks
CHUNK_ROWS = 2048  # tokens per chunk


def _chunk_logits(h: Tensor, w: Tensor) -> Tensor:
    with torch.autocast(h.device.type, enabled=False):
        return (h @ w.T)[None]


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(logp [N], entropy [N]) float32 of `targets` [N] under softmax((hidden [N, H] @ weight.T) * inv_temp), the
    product in `dtype`, `rows` tokens at a time."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, inv_temp: float, dtype: torch.dtype, rows: int):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        h, w = hidden.detach().to(dtype), weight.detach().to(dtype)
        targets = targets.contiguous()
        out = [torch.empty(targets.shape, dtype=torch.float32, device=h.device) for _ in range(3)]
        for s in range(0, h.shape[0], rows):
            logp, entropy, lse = vocab_forward(_chunk_logits(h[s : s + rows], w), targets[None, s : s + rows], inv_temp)
            for dst, src in zip(out, (logp, entropy, lse), strict=True):
                dst[s : s + rows] = src[0]
        ctx.save_for_backward(hidden, weight, targets, out[2], out[1])
        ctx.inv_temp, ctx.dtype, ctx.rows = inv_temp, dtype, rows
        return out[0], out[1]

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        h, w, rows = hidden.detach().to(ctx.dtype), weight.detach().to(ctx.dtype), ctx.rows
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if ctx.needs_input_grad[1] else None
        for s in range(0, h.shape[0], rows):
            part = slice(s, s + rows)
            logits = _chunk_logits(h[part], w)
            grads = tuple(None if g is None else g[None, part] for g in (grad_logp, grad_entropy))
            saved = (logits, targets[None, part], lse[None, part], entropy[None, part])
            vocab_backward(saved, ctx.inv_temp, grads, logits)  # the logits' gradient, in place
            with torch.autocast(h.device.type, enabled=False):
                if grad_h is not None:
                    grad_h[part] = logits[0] @ w
                if grad_w is not None:
                    grad_w += (logits[0].T @ h[part]).float()
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


def plain_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's lm head when it is a plain bias-free linear layer applied to the decoder's output as is (no
    logit scaling or soft-capping) whose weight is whole on this process, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    plain = isinstance(head, torch.nn.Linear) and head.bias is None
    if not plain or type(head).forward not in (torch.nn.Linear.forward, Float32LMHead.forward):
        return None
    cfg = model.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return None
    if isinstance(head.weight.data, DTensor):  # sharded (FSDP2): only the head's own forward gathers it
        return None
    return head if hasattr(model, "get_decoder") else None


def over_budget(tokens: int, vocab: int) -> bool:
    return tokens * vocab * 4 > LOGITS_BUDGET_BYTES


def token_logprobs_chunked(
    model: torch.nn.Module, inv_temp: float, entropy_grad: bool, **inputs: object
) -> tuple[Tensor, Tensor] | None:
    """(logp [B, L-1], entropy [B, L-1]) of each next token of `inputs["input_ids"]` [B, L] through the decoder and
    the chunked head; None when the model's head is not plain or its full logits fit the budget (the caller runs
    the plain forward)."""
    ids: Tensor = inputs["input_ids"]  # type: ignore[assignment]
    head = plain_head(model)
    if head is None or not over_budget(ids.numel(), head.weight.shape[0]):
        return None
    hidden = model.get_decoder()(**inputs).last_hidden_state[:, :-1]
    b, t = hidden.shape[:2]
    dtype = head_dtype(head, hidden)
    flat = hidden.reshape(b * t, -1)
    logp, entropy = ChunkedHeadLogprobs.apply(flat, head.weight, ids[:, 1:].reshape(-1), inv_temp, dtype, CHUNK_ROWS)
    logp, entropy = logp.view(b, t), entropy.view(b, t)
    return logp, entropy if entropy_grad else entropy.detach()

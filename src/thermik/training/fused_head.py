"""The lm head with its token logprobs, and the embedding lookup, without vocabulary-sized temporaries per call.

A small model's vocabulary-sized tensors are its largest: SmolLM2's head (tied to its embedding) is [49152, 576],
and a micro-batch's logits [1156, 49152] are 113 MB in bfloat16. Through `nn.Linear`, `VocabLogprobs` and
`nn.Embedding` each micro-batch allocates fresh ones: the weight's bfloat16 copy, the logits, their gradient, the
weight's gradient in bfloat16 and again in float32, and the embedding's dense zero gradient. glibc maps each
allocation that large afresh, so every one faults its pages in: in a profiled update of the SmolLM2 example the
embedding's zero fills and the [vocab, hidden] casts were among the largest costs.

`HeadLogprobs` computes the weight's cast and the logits into buffers kept from one call to the next (~290 MB for
SmolLM2's micro-batches), writes the logits' gradient over the logits (`vocab_backward` allows it), and adds the
weight's gradient into `weight.grad` in place, as `EmbeddingIntoGrad` does for the lookup's rows. Neither hands
the weight's gradient to autograd, so hooks on the weight (`register_hook`, DDP's, FSDP's) do not see it: the
shared-prompt forward, their only caller, never runs under such wrappers (`supports_shared_prefix`). Results
equal `head(x)` + `VocabLogprobs` and `embedding(ids)`, values and gradients (tested).
"""

from __future__ import annotations

import math
import threading
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from thermik.training.mixed_precision import Float32LMHead
from thermik.training.vocab_logprobs import vocab_backward, vocab_forward


class _Lease:
    """Held by the autograd context of the forward that uses the process's buffers, until its backward ends."""


class _Buffers:
    """The process's buffers: logits (and, after backward, their gradient), the weight's cast, the weight's gradient
    in the compute dtype. One forward at a time uses them, from its forward to the end of its backward (it holds the
    lease); a forward meanwhile, in any thread, gets fresh tensors."""

    def __init__(self) -> None:
        self.flat: dict[tuple[str, torch.dtype, torch.device], Tensor] = {}
        self.lease: weakref.ref[_Lease] | None = None
        self._lock = threading.Lock()

    def take(self) -> _Lease | None:
        with self._lock:
            if self.lease is not None and self.lease() is not None:
                return None
            lease = _Lease()
            self.lease = weakref.ref(lease)
            return lease

    def tensor(
        self, lease: _Lease | None, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> Tensor:
        """A [shape] view of the buffer `name`, grown (never shrunk) to fit, for the lease's holder; a fresh tensor
        without a lease."""
        if lease is None:
            return torch.empty(shape, dtype=dtype, device=device)
        key, numel = (name, dtype, device), math.prod(shape)
        flat = self.flat.get(key)
        if flat is None or flat.numel() < numel:
            flat = self.flat[key] = torch.empty(numel, dtype=dtype, device=device)
        return flat[:numel].view(shape)


_buffers = _Buffers()


ADD_BLOCK = 1 << 20  # elements per block of a mixed-dtype add: a 4 MB float32 cast, reused by the allocator

_grad_homes = WeakIdKeyDictionary()  # parameter -> its kept gradient tensor (keyed by identity, held weakly)


def _grad_home(param: Tensor) -> Tensor:
    """The tensor that becomes `param.grad` when this module gives it a first gradient, kept from one update to
    the next (`zero_grad(set_to_none=True)` drops .grad, not this). A fresh [vocab, hidden] gradient would fault
    all its pages in again at every update (113 MB for SmolLM2's head). So the parameter's gradient is
    the same tensor at every update, as under `zero_grad(set_to_none=False)`."""
    home = _grad_homes.get(param)
    if home is None or home.shape != param.shape or home.dtype != param.dtype or home.device != param.device:
        home = _grad_homes[param] = torch.empty_like(param, memory_format=torch.contiguous_format)
    return home


def _add_into(dst: Tensor, src: Tensor) -> None:
    """dst += src in place. For a src of another dtype, in blocks: PyTorch's mixed-dtype add_ casts all of src to
    a fresh tensor first, whose page faults cost far more than the add."""
    if src.dtype == dst.dtype or dst.numel() <= ADD_BLOCK:
        dst.add_(src)
        return
    flat_dst, flat_src = dst.view(-1), src.reshape(-1)
    for start in range(0, flat_dst.numel(), ADD_BLOCK):
        flat_dst[start : start + ADD_BLOCK].add_(flat_src[start : start + ADD_BLOCK])


def accumulate_grad(param: Tensor, grad: Tensor) -> None:
    """param.grad += grad, in place (grad in any float dtype); the first gradient is copied, in param's dtype, into
    the parameter's kept gradient tensor (`_grad_home`)."""
    if param.grad is None:
        param.grad = _grad_home(param).copy_(grad)
    else:
        _add_into(param.grad, grad)


class HeadLogprobs(torch.autograd.Function):
    """(logp [K], entropy [K]) float32 of `targets` [K] under softmax((hidden [K, H] @ weight.T) * inv_temp), the
    product in `dtype`. The weight's gradient is added into weight.grad (module docstring); returns none for it."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, inv_temp: float, dtype: torch.dtype):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        lease = _buffers.take()
        h = hidden.detach().to(dtype)
        shape = (1, h.shape[0], weight.shape[0])
        # The weight is cast at every forward: a fused optimizer step changes it without bumping its version counter.
        w = _buffers.tensor(lease, "weight", tuple(weight.shape), dtype, h.device).copy_(weight.detach())
        logits = _buffers.tensor(lease, "logits", shape, dtype, h.device)
        with torch.autocast(h.device.type, enabled=False):
            torch.mm(h, w.T, out=logits[0])
        targets = targets.contiguous()[None]
        logp, entropy, lse = vocab_forward(logits, targets, inv_temp)
        ctx.save_for_backward(logits, targets, lse, entropy, h, w)
        ctx.weight, ctx.inv_temp, ctx.lease, ctx.used = weight, inv_temp, lease, False
        return logp[0], entropy[0]

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        if ctx.used:
            raise RuntimeError("HeadLogprobs: backward ran twice (its gradient overwrote the logits it would need)")
        ctx.used = True
        logits, targets, lse, entropy, h, w = ctx.saved_tensors
        grads = tuple(None if g is None else g[None] for g in (grad_logp, grad_entropy))
        vocab_backward((logits, targets, lse, entropy), ctx.inv_temp, grads, logits)  # the gradient, in place
        grad = logits[0]
        with torch.autocast(h.device.type, enabled=False):
            grad_hidden = grad @ w if ctx.needs_input_grad[0] else None
            weight = ctx.weight
            if weight.requires_grad:
                out = _buffers.tensor(ctx.lease, "weight_grad", tuple(weight.shape), h.dtype, h.device)
                accumulate_grad(weight, torch.mm(grad.T, h, out=out))
        ctx.lease = None
        return grad_hidden, None, None, None, None


class EmbeddingIntoGrad(torch.autograd.Function):
    """weight[ids] whose backward adds the rows' gradients into weight.grad in place (no dense [vocab, hidden] zero
    gradient per call); rows of `padding_idx` get none, as in `nn.Embedding`."""

    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return F.embedding(ids, weight.detach())

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        rows, grad_rows = ids.flatten(), grad_out.reshape(-1, weight.shape[1]).to(weight.dtype)
        if ctx.padding_idx is not None:
            keep = rows != ctx.padding_idx
            rows, grad_rows = rows[keep], grad_rows[keep]
        if weight.grad is None:
            weight.grad = _grad_home(weight).zero_()
        weight.grad.index_add_(0, rows, grad_rows)
        return None, None, None


def head_dtype(head: torch.nn.Module, x: Tensor) -> torch.dtype:
    """The dtype `head(x)` computes in: float32 for a `Float32LMHead`, else autocast's, else the weight's."""
    if isinstance(head, Float32LMHead):
        return torch.float32
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else head.weight.dtype


def head_logprobs(head: torch.nn.Module, x: Tensor, targets: Tensor, inv_temp: float) -> tuple[Tensor, Tensor] | None:
    """(logp [K], entropy [K]) of `targets` [K] under softmax(head(x) * inv_temp) for x [K, H]; None where `head` is
    not a plain bias-free `nn.Linear` (a PEFT-wrapped head, say): the caller runs the module."""
    plain = isinstance(head, torch.nn.Linear) and head.bias is None
    if not plain or type(head).forward not in (torch.nn.Linear.forward, Float32LMHead.forward):
        return None
    return HeadLogprobs.apply(x, head.weight, targets, inv_temp, head_dtype(head, x))


def embed(embedding: torch.nn.Module, ids: Tensor) -> Tensor:
    """`embedding(ids)`, through `EmbeddingIntoGrad` for a plain trainable `nn.Embedding`."""
    plain = type(embedding) is torch.nn.Embedding and embedding.max_norm is None and not embedding.sparse
    if not (plain and embedding.weight.requires_grad and torch.is_grad_enabled()) or embedding.scale_grad_by_freq:
        return embedding(ids)
    return EmbeddingIntoGrad.apply(ids, embedding.weight, embedding.padding_idx)

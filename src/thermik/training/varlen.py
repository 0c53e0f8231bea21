"""Varlen attention for packed sequences: one row of sequences laid end to end, no mask, no padding computed.

A varlen forward takes the packed sequences as a single row [1, T] with position ids restarting at 0 for each
sequence, plus the cumulative sequence lengths `cu_seq_lens` [S + 1] (int32) and the longest length. Attention then
runs per sequence: its cost is the sum of each sequence's square, not the row's square, and no [L, L] mask exists.

- Flash attention (`flash_attention_2/3/4`, CUDA): transformers' attention takes `cu_seq_lens_q/k` and
  `max_length_q/k` as keyword arguments and calls the flash varlen kernel with them (no host sync to find them).
- Any other implementation (`sdpa`, `eager`; CPU or a GPU without flash-attn): the forward runs under the
  attention implementation `thermik_segments` (registered with transformers here), which computes causal
  scaled-dot-product attention one sequence at a time from the same `cu_seq_lens`. It is chosen per forward
  (`segment_attention`), so the model's other forwards (padded, generation) keep their own implementation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

SEGMENT_ATTENTION = "thermik_segments"


def attention_implementation(model: torch.nn.Module) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


def has_varlen_kernel(model: torch.nn.Module) -> bool:
    """Whether the model's own attention takes `cu_seq_lens` (flash attention)."""
    return attention_implementation(model).startswith("flash")


def varlen_kwargs(lengths: list[int], device: torch.device) -> dict[str, object]:
    """The keyword arguments of a varlen forward over sequences of `lengths` laid end to end in one row."""
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    longest = max(lengths)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def segment_kwargs(lengths: list[int], device: torch.device) -> dict[str, object]:
    """`varlen_kwargs` plus the boundaries as a host tuple, which `thermik_segments` reads without a device sync."""
    bounds = tuple(itertools.accumulate(lengths, initial=0))
    return {**varlen_kwargs(lengths, device), "segment_bounds": bounds}


def _segments_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Causal attention of each packed sequence on its own. query [1, H, T, D], key/value [1, KV, T, D] -> [1, T, H,
    D], as transformers' attention functions return it."""
    if cu_seq_lens_q is None or query.shape[0] != 1:
        raise ValueError("thermik_segments attention needs one packed row and its cu_seq_lens_q")
    bounds = kwargs.get("segment_bounds") or cu_seq_lens_q.tolist()  # the host's copy saves a sync per layer
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=p, is_causal=True, scale=scaling,
            enable_gqa=gqa,
        )
        for s, e in itertools.pairwise(bounds)
        if e > s
    ]  # fmt: skip
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SEGMENT_ATTENTION, _segments_attention)


@contextmanager
def segment_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run the model's forwards inside under `thermik_segments` attention (restored on exit). transformers builds
    no mask for an implementation without a mask function, so none of [L, L] is made."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = SEGMENT_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before

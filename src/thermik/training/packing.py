"""Sequence packing: several sequences share one row, each attending only to itself.

Rows are filled first-fit by decreasing length (`pack`). Inside a row every sequence restarts its position ids at 0
and the attention mask is block-diagonal and causal (`block_causal_bias`), so each sequence's logits equal what
the model computes on it alone, up to float rounding; the padding a batch of mixed lengths would need is gone
(benchmarks/packing.py). Two ways to run the packed forward:

- varlen (`pack_for` lays all sequences end to end in ONE row): attention runs per sequence from cumulative sequence
  lengths, no mask, no padding (training/varlen.py): flash attention's varlen kernel where the model uses flash
  attention, else, off the CPU, per-sequence SDPA (`thermik_segments`; on the CPU with `SEGMENTS_ON_CPU`);
- masked (rows of `max_tokens`): an explicit [R, 1, L, L] block-diagonal mask, which the transformers models take
  as is: boolean for SDPA attention, additive for eager. It still computes attention over each whole row; it is
  the CPU's default and what a model whose attention is neither SDPA, eager nor flash gets.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from thermik.training.batch import effective_temperature, logprobs_and_entropy
from thermik.training.chunked_head import token_logprobs_chunked
from thermik.training.varlen import (
    attention_implementation,
    has_varlen_kernel,
    segment_attention,
    segment_kwargs,
    varlen_kwargs,
)

VARLEN_SEGMENTS = ("sdpa", "eager")  # attention implementations the per-sequence fallback stands in for
# On the CPU the masked rows stay the default: there the per-sequence calls were no faster than the masked rows
# (benchmarks/packing.py compares all three); on a GPU they reach SDPA's flash kernel, which a mask rules out.
SEGMENTS_ON_CPU = False


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # [R, L] the sequences laid end to end, right-padded
    position_ids: torch.Tensor  # [R, L] 0.. within each sequence (padding continues its own count)
    segments: torch.Tensor  # [R, L] which sequence of the row each token belongs to (padding: its own segment)
    places: tuple[tuple[int, int, int], ...]  # per input sequence, in input order: (row, start, length)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def segment_lengths(self) -> list[int]:
        """The lengths of the segments of the rows laid end to end (each row's sequences, then its padding)."""
        return torch.unique_consecutive(self.segments.flatten(), return_counts=True)[1].tolist()


def uses_varlen(model: torch.nn.Module) -> bool:
    """Whether the packed forward of `model` runs varlen (one row, per-sequence attention): flash attention, or the
    per-sequence fallback for SDPA/eager."""
    if has_varlen_kernel(model):
        return True
    on_cpu = next(model.parameters()).device.type == "cpu"
    return attention_implementation(model) in VARLEN_SEGMENTS and (SEGMENTS_ON_CPU or not on_cpu)


def pack_for(model: torch.nn.Module, seqs: list[list[int]], max_tokens: int, pad_id: int) -> PackedBatch:
    """`seqs` packed the way `model`'s packed forward takes them: one row of all of them for a varlen forward, else
    rows of max_tokens (`pack`)."""
    return pack(seqs, sum(len(s) for s in seqs) if uses_varlen(model) else max_tokens, pad_id)


def pack(seqs: list[list[int]], max_tokens: int, pad_id: int) -> PackedBatch:
    """Pack `seqs` into rows of at most max(max_tokens, longest sequence) tokens, first-fit by decreasing length.
    The row width is the longest filled row, not max_tokens."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pack: every sequence needs at least one token")
    capacity = max(max_tokens, max(len(s) for s in seqs))
    fill: list[int] = []  # tokens used per row
    places: list[tuple[int, int, int]] = [(0, 0, 0)] * len(seqs)
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        n = len(seqs[i])
        row = next((r for r, used in enumerate(fill) if used + n <= capacity), len(fill))
        if row == len(fill):
            fill.append(0)
        places[i] = (row, fill[row], n)
        fill[row] += n
    width = max(fill)
    input_ids = torch.full((len(fill), width), pad_id, dtype=torch.long)
    positions = torch.arange(width).repeat(len(fill), 1)
    segments = torch.zeros((len(fill), width), dtype=torch.long)
    for i, (row, start, n) in enumerate(places):
        input_ids[row, start : start + n] = torch.tensor(seqs[i])
        positions[row, start : start + n] = torch.arange(n)
        segments[row, start : start + n] = i + 1
    for row, used in enumerate(fill):  # the tail of a row: one segment of its own, positions counting on from 0
        positions[row, used:] = torch.arange(width - used)
        segments[row, used:] = -(row + 1)
    return PackedBatch(input_ids, positions, segments, tuple(places))


def block_causal_allowed(segments: torch.Tensor) -> torch.Tensor:
    """[R, 1, L, L] bool: True where query i may see key j (same segment and j <= i)."""
    same = segments[:, :, None] == segments[:, None, :]
    causal = torch.ones(segments.shape[1], segments.shape[1], dtype=torch.bool, device=segments.device).tril()
    return (same & causal)[:, None]


def block_causal_bias(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form [R, 1, L, L]: 0 where allowed, else the dtype's most negative value (not -inf: a row of it
    would give NaN)."""
    allowed = block_causal_allowed(segments)
    return torch.zeros(allowed.shape, dtype=dtype, device=segments.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def packed_attention_mask(model: torch.nn.Module, segments: torch.Tensor) -> torch.Tensor | None:
    """The mask the model's attention takes as is: boolean for SDPA (any query dtype, also under autocast), additive
    in the parameters' dtype for eager (or any other) attention, which adds the mask to the scores."""
    impl = attention_implementation(model)
    if impl == "sdpa":
        return block_causal_allowed(segments)
    dtype = next(model.parameters()).dtype
    return block_causal_bias(segments, dtype if dtype.is_floating_point else torch.float32)


def packed_token_logprobs(
    model: torch.nn.Module, packed: PackedBatch, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [R, L-1] of each next token of the packed rows; a position whose next token starts another
    sequence holds a value that belongs to no sequence (`unpack` drops it)."""
    device = next(model.parameters()).device
    if uses_varlen(model):  # the rows laid end to end in one
        inputs = {
            "input_ids": packed.input_ids.view(1, -1).to(device),
            "position_ids": packed.position_ids.view(1, -1).to(device),
            "use_cache": False,
            **(varlen_kwargs if has_varlen_kernel(model) else segment_kwargs)(packed.segment_lengths(), device),
        }
        with nullcontext() if has_varlen_kernel(model) else segment_attention(model):
            inv_temp = 1.0 / effective_temperature(temperature)
            chunked = token_logprobs_chunked(model, inv_temp, entropy_grad, **inputs)
            if chunked is not None:  # [1, R*L - 1] -> [R, L - 1]
                rows = packed.input_ids.shape
                return tuple(F.pad(x, (0, 1)).view(rows)[:, :-1] for x in chunked)  # type: ignore[return-value]
            logits = model(**inputs).logits.view(*packed.input_ids.shape, -1)
    else:
        logits = model(
            input_ids=packed.input_ids.to(device),
            attention_mask=packed_attention_mask(model, packed.segments.to(device)),  # per sequence, causal
            position_ids=packed.position_ids.to(device),
            use_cache=False,
        ).logits
    return logprobs_and_entropy(logits, packed.input_ids[:, 1:].to(device), temperature, entropy_grad)


def unpack(values: torch.Tensor, packed: PackedBatch, width: int) -> torch.Tensor:
    """Per-token values [R, L-1] of packed rows -> [B, width - 1] aligned like an unpacked right-padded batch
    (position t: the value of sequence token t + 1; zeros after each sequence's end)."""
    out = values.new_zeros((len(packed.places), width - 1))
    for i, (row, start, n) in enumerate(packed.places):
        out[i, : n - 1] = values[row, start : start + n - 1]
    return out

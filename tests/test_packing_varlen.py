"""Varlen packed forward: one row, cumulative sequence lengths, no [L, L] mask; the padded batch's logprobs."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from thermik.models.loading import load_model
from thermik.training import packing, update
from thermik.training.batch import TokenBatch, token_logprobs
from thermik.training.varlen import SEGMENT_ATTENTION, varlen_kwargs


def _seqs() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 150, (n,), generator=g).tolist() for n in (7, 31, 2, 19, 11, 26)]


def _padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return ids, mask


def test_varlen_kwargs_are_the_cumulative_lengths():
    kw = varlen_kwargs([3, 5, 1], torch.device("cpu"))
    assert kw["cu_seq_lens_q"].tolist() == [0, 3, 8, 9] and kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["max_length_q"] == kw["max_length_k"] == 5


def test_segment_lengths_of_rows_laid_end_to_end():
    packed = packing.pack([[1] * 4, [2] * 3, [3] * 2], 6, pad_id=0)  # rows (4, 2) and (3, pad 3)
    assert packed.segment_lengths() == [4, 2, 3, 3]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_varlen_logprobs_equal_the_padded_batch_without_a_mask(tiny_model_dir, monkeypatch, attention):
    model = load_model(tiny_model_dir)
    model.set_attn_implementation(attention)
    assert not packing.uses_varlen(model)  # the CPU's default: the masked rows
    monkeypatch.setattr(packing, "SEGMENTS_ON_CPU", True)
    assert packing.uses_varlen(model)
    seqs = _seqs()
    ids, mask = _padded(seqs)
    logp0, ent0 = token_logprobs(model, ids, mask)
    monkeypatch.setattr(packing, "block_causal_allowed", lambda *a: pytest.fail("a [R, 1, L, L] mask was built"))
    seen = []
    real = ALL_ATTENTION_FUNCTIONS[SEGMENT_ATTENTION]
    monkeypatch.setitem(
        ALL_ATTENTION_FUNCTIONS._global_mapping,
        SEGMENT_ATTENTION,
        lambda m, q, k, v, mask, **kw: (
            seen.append((q.shape[2], mask, kw["cu_seq_lens_q"].tolist())) or real(m, q, k, v, mask, **kw)
        ),
    )
    packed = packing.pack_for(model, seqs, 8, pad_id=0)
    assert packed.rows == 1 and packed.input_ids.shape[1] == sum(map(len, seqs))  # no padding at all
    logp, ent = packing.packed_token_logprobs(model, packed)
    assert seen and all(t == sum(map(len, seqs)) and m is None for t, m, _ in seen)
    assert seen[0][2] == [0, *torch.tensor(packed.segment_lengths()).cumsum(0).tolist()]
    assert model.config._attn_implementation == attention  # restored after the forward
    width = ids.shape[1]
    on = mask[:, 1:].bool()
    torch.testing.assert_close(packing.unpack(logp, packed, width)[on], logp0[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(packing.unpack(ent, packed, width)[on], ent0[on], rtol=0, atol=1e-5)


def test_flash_attention_gets_one_row_and_the_cumulative_lengths(tiny_model_dir, monkeypatch):
    """The flash path, with the per-sequence function standing in for the flash kernel (no CUDA here): the model
    receives the rows as one, position ids restarting per sequence, and cu_seq_lens / max_length keyword
    arguments (what transformers' flash varlen call takes); the result equals the padded batch."""
    model = load_model(tiny_model_dir)
    ids, mask = _padded(_seqs())
    logp0, _ = token_logprobs(model, ids, mask)
    seen = []
    real = ALL_ATTENTION_FUNCTIONS[SEGMENT_ATTENTION]

    def flash_stand_in(m, q, k, v, attn_mask, **kw):
        seen.append((q.shape[0], attn_mask, kw["max_length_q"]))
        return real(m, q, k, v, attn_mask, **kw)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_2", flash_stand_in)
    model.config._attn_implementation = "flash_attention_2"
    zeros = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    mb = TokenBatch(ids, mask, mask[:, 1:].float(), zeros, zeros)
    logp, _ = update.packed_rows_logprobs(model, mb, 1.0, entropy_grad=False)
    assert seen and all(b == 1 and am is None and mx == 31 for b, am, mx in seen)
    on = mask[:, 1:].bool()
    torch.testing.assert_close(logp[on], logp0[on], rtol=0, atol=1e-5)

"""The chunked lm head + logprob + entropy: values and gradients of the full head, no full-vocab logits."""

from __future__ import annotations

import copy

import pytest
import torch

from thermik.models.loading import load_model
from thermik.training import chunked_head, packing
from thermik.training.batch import token_logprobs
from thermik.training.chunked_head import ChunkedHeadLogprobs
from thermik.training.vocab_logprobs import vocab_logprobs


@pytest.mark.parametrize("rows", [3, 7, 64])
def test_chunks_equal_the_full_head_values_and_gradients(rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    weight = torch.randn(97, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 97, (20,), generator=g)
    coef = torch.randn(20, generator=g)
    logp, ent = ChunkedHeadLogprobs.apply(hidden, weight, targets, 0.7, torch.float32, rows)
    (logp * coef + 0.1 * ent).sum().backward()
    got = (logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    full_logp, full_ent = vocab_logprobs((hidden @ weight.T)[None], targets[None], 1 / 0.7)
    (full_logp[0] * coef + 0.1 * full_ent[0]).sum().backward()
    for a, b in zip(got, (full_logp[0].detach(), full_ent[0].detach(), hidden.grad, weight.grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_model_over_the_budget_never_makes_full_logits(tiny_model_dir, monkeypatch) -> None:
    model = load_model(tiny_model_dir)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 150, (4, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 30:] = mask[3, 12:] = 0
    logp0, ent0 = token_logprobs(ref, ids, mask)
    (logp0 * mask[:, 1:]).sum().backward()
    monkeypatch.setattr(chunked_head, "LOGITS_BUDGET_BYTES", 0)
    monkeypatch.setattr(chunked_head, "CHUNK_ROWS", 16)
    head = model.get_output_embeddings()
    monkeypatch.setattr(head, "forward", lambda *a: pytest.fail("the full head ran"), raising=False)
    logp, ent = token_logprobs(model, ids, mask)
    (logp * mask[:, 1:]).sum().backward()
    on = mask[:, 1:].bool()
    torch.testing.assert_close(logp[on], logp0[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[on], ent0[on], rtol=0, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_varlen_rows_through_the_chunked_head(tiny_model_dir, monkeypatch) -> None:
    model = load_model(tiny_model_dir)
    monkeypatch.setattr(packing, "SEGMENTS_ON_CPU", True)
    seqs = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    packed = packing.pack(seqs, 8, pad_id=0)  # two rows laid end to end
    logp0, ent0 = packing.packed_token_logprobs(model, packed)
    monkeypatch.setattr(chunked_head, "LOGITS_BUDGET_BYTES", 0)
    monkeypatch.setattr(chunked_head, "CHUNK_ROWS", 4)
    logp, ent = packing.packed_token_logprobs(model, packed)
    assert logp.shape == logp0.shape
    width = max(map(len, seqs))
    for a, b in ((logp, logp0), (ent, ent0)):
        torch.testing.assert_close(
            packing.unpack(a, packed, width), packing.unpack(b, packed, width), atol=1e-5, rtol=0
        )


def test_the_budget_leaves_small_vocabularies_to_the_plain_forward() -> None:
    assert not chunked_head.over_budget(16 * 512, 600)  # a tiny preset's micro-batch
    assert chunked_head.over_budget(16 * 2048, 151_936)  # Qwen's vocabulary at RL sizes: 20 GB of float32 logits

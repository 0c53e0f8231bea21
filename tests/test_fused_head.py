"""training/fused_head: the lm head's logprobs and the embedding lookup equal the modules they replace, values and
gradients, with the weight's gradient accumulated in place; the vocabulary gradient written over the logits equals
the one written apart. Both vocabulary paths run (C kernels, and PyTorch with THERMIK_CPU_KERNELS=0)."""

from __future__ import annotations

import pytest
import torch

from thermik.training import fused_head
from thermik.training.fused_head import HeadLogprobs, embed, head_logprobs
from thermik.training.mixed_precision import Float32LMHead
from thermik.training.vocab_logprobs import vocab_backward, vocab_forward, vocab_logprobs

VOCAB, HIDDEN, TOKENS = 301, 24, 19


@pytest.fixture(params=["kernels", "torch"])
def path(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    return request.param


def tied(padding_idx: int | None = None) -> tuple[torch.nn.Embedding, torch.nn.Linear]:
    """An embedding and a bias-free head sharing one weight, as in SmolLM2 and Qwen2's small models."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(VOCAB, HIDDEN, padding_idx=padding_idx)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    head.weight = embedding.weight
    return embedding, head


def loss_of(fused: bool, embedding, head, ids, targets, mix, inv_temp: float = 1.0) -> torch.Tensor:
    """A loss through embedding -> a mixing layer -> head -> logprob and entropy of the targets."""
    x = (embed(embedding, ids) if fused else embedding(ids)) @ mix
    if fused:
        out = head_logprobs(head, x, targets, inv_temp)
        assert out is not None
        logp, entropy = out
    else:
        logp, entropy = (v[0] for v in vocab_logprobs(head(x)[None], targets[None], 1.0 / inv_temp))
    weights = torch.linspace(-1.0, 1.0, len(targets))
    return (logp * weights).sum() + 0.1 * entropy.sum()


def data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    ids[:3] = 0  # repeated rows, and the padding row when padding_idx=0
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    mix = (torch.randn(HIDDEN, HIDDEN, generator=gen) / HIDDEN**0.5).requires_grad_()
    return ids, targets, mix


@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("inv_temp", [1.0, 1.25])
def test_equals_the_modules_values_and_gradients(path: str, padding_idx: int | None, inv_temp: float) -> None:
    embedding, head = tied(padding_idx)
    ids, targets, mix = data()
    results = []
    for fused in (False, True):
        embedding.zero_grad(set_to_none=True)
        mix.grad = None
        loss = loss_of(fused, embedding, head, ids, targets, mix, inv_temp)
        loss.backward()
        results.append((loss.detach(), embedding.weight.grad.clone(), mix.grad.clone()))
    (want_loss, want_w, want_mix), (loss, grad_w, grad_mix) = results
    torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_w, want_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad_mix, want_mix, atol=1e-6, rtol=1e-5)
    if padding_idx is not None:
        assert torch.count_nonzero(want_w[padding_idx] - grad_w[padding_idx]) == 0


def test_gradients_accumulate_and_weight_updates_are_seen() -> None:
    """Two micro-batches add into one weight.grad; after an in-place step by a fused optimizer (which does not bump
    the weight's version counter) the next forward computes with the new weight."""
    runs = []
    for fused in (False, True):
        embedding, head = tied()
        (ids, targets, mix), (ids2, targets2, _) = data(1), data(2)
        optimizer = torch.optim.AdamW(embedding.parameters(), lr=0.1, fused=True)
        losses = []
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            for batch_ids, batch_targets in ((ids, targets), (ids2, targets2)):
                loss = loss_of(fused, embedding, head, batch_ids, batch_targets, mix)
                loss.backward()
                losses.append(loss.detach())
            grad = embedding.weight.grad.clone()
            optimizer.step()
        runs.append((torch.stack(losses), grad, embedding.weight.detach().clone()))
    for got, want in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_untied_bfloat16_gradients_over_updates_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """An untied embedding and a bfloat16 head: over two updates (`zero_grad(set_to_none=True)` between them) the
    gradients equal the modules', with each weight's kept gradient tensor reused (no stale values carried over)
    and the bfloat16 head gradient added into the float32 one in blocks (a block size that does not divide it)."""
    monkeypatch.setattr(fused_head, "ADD_BLOCK", 1000)
    grads: dict[bool, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for fused in (False, True):
        embedding, head = tied()
        head.weight = torch.nn.Parameter(embedding.weight.detach().flip(0).clone())
        params = [embedding.weight, head.weight]
        grads[fused], kept = [], []
        for update in range(2):
            for p in params:
                p.grad = None
            for seed in (1, 2):
                ids, targets, mix = data(seed + update)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss_of(fused, embedding, head, ids, targets, mix).backward()
            grads[fused].append(tuple(p.grad.clone() for p in params))
            kept.append([p.grad.data_ptr() for p in params])
            with torch.no_grad():  # a step between updates
                for p in params:
                    p.sub_(0.5 * p.grad)
        if fused:
            assert kept[0] == kept[1]
    for got, want in zip(grads[True], grads[False], strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)


def test_bfloat16_and_float32_heads_follow_the_module_precision() -> None:
    """Under autocast a plain head computes in bfloat16 and a `Float32LMHead` in float32, as the modules do."""
    embedding, head = tied()
    ids, targets, mix = data()
    x = (embedding(ids) @ mix).detach()
    for head_class, tolerance in ((torch.nn.Linear, 2e-2), (Float32LMHead, 1e-5)):
        head.__class__ = head_class
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(x)
            fused = head_logprobs(head, x, targets, 1.0)
        assert fused is not None
        want = vocab_logprobs(logits[None], targets[None])
        torch.testing.assert_close(fused[0], want[0][0], atol=tolerance, rtol=0)
    head.__class__ = torch.nn.Linear


def test_a_head_with_a_bias_or_a_wrapper_is_left_to_its_module() -> None:
    x, targets = torch.randn(4, HIDDEN), torch.randint(0, VOCAB, (4,))
    assert head_logprobs(torch.nn.Linear(HIDDEN, VOCAB, bias=True), x, targets, 1.0) is None

    class Wrapped(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    assert head_logprobs(Wrapped(HIDDEN, VOCAB, bias=False), x, targets, 1.0) is None


def test_overlapping_graphs_and_a_second_backward() -> None:
    """A forward while another's backward is pending gets its own tensors (both backwards stay right); a second
    backward through one graph is refused, since the first overwrote its logits."""
    embedding, head = tied()
    ids, targets, mix = data()
    want = []
    for seed in (3, 4):
        embedding.zero_grad(set_to_none=True)
        loss_of(False, embedding, head, ids, targets, mix * seed).backward()
        want.append(embedding.weight.grad.clone())
    embedding.zero_grad(set_to_none=True)
    first = loss_of(True, embedding, head, ids, targets, mix * 3)
    second = loss_of(True, embedding, head, ids, targets, mix * 4)
    second.backward(retain_graph=True)
    torch.testing.assert_close(embedding.weight.grad, want[1], atol=1e-6, rtol=1e-5)
    first.backward()
    torch.testing.assert_close(embedding.weight.grad, want[0] + want[1], atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        second.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocabulary_gradient_written_over_the_logits(path: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 7, 1037, generator=gen) * 4).to(dtype)
    targets = torch.randint(0, 1037, (2, 7), generator=gen)
    grads = (torch.randn(2, 7, generator=gen), torch.randn(2, 7, generator=gen))
    _, entropy, lse = vocab_forward(logits, targets, 0.8)
    apart = torch.empty_like(logits)
    vocab_backward((logits, targets, lse, entropy), 0.8, grads, apart)
    vocab_backward((logits, targets, lse, entropy), 0.8, grads, logits)
    assert torch.equal(logits, apart)


def test_a_forward_outside_autograd_leaves_the_buffers_free() -> None:
    """Under no_grad nothing waits for a backward: the thread's buffers are free for the next forward at once."""
    embedding, head = tied()
    ids, targets, mix = data()
    with torch.no_grad():
        logp, _ = HeadLogprobs.apply(embedding(ids) @ mix, head.weight, targets, 1.0, torch.float32)
    lease = fused_head._buffers.lease
    assert lease is not None and lease() is None
    want = vocab_logprobs(head(embedding(ids) @ mix).detach()[None], targets[None])[0][0]
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)

"""training/vocab_logprobs: token logprobs, entropy and their gradients against PyTorch's log-softmax in float32.

Both paths run: the C kernels (cpu/csrc/vocab.c) and the PyTorch block path (THERMIK_CPU_KERNELS=0)."""

from __future__ import annotations

import pytest
import torch

from thermik.training.vocab_logprobs import vocab_logprobs


def reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = torch.log_softmax(logits[:, : targets.shape[1]].float() / temperature, dim=-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def objective(logp: torch.Tensor, entropy: torch.Tensor, weights: tuple[torch.Tensor, ...], entropy_grad: bool):
    return (logp * weights[0]).sum() + ((entropy * weights[1]).sum() if entropy_grad else 0.0)


@pytest.fixture(params=["kernels", "torch"])
def path(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("extra_positions", [0, 1])
def test_matches_log_softmax(path: str, dtype, temperature: float, entropy_grad: bool, extra_positions: int) -> None:
    gen = torch.Generator().manual_seed(0)
    # 1037 entries: not a multiple of 16 (the kernels' vector tail); a spread of 4 gives peaked and flat rows.
    logits = (torch.randn(3, 37 + extra_positions, 1037, generator=gen) * 4).to(dtype).requires_grad_()
    targets = torch.randint(0, 1037, (3, 37), generator=gen)
    weights = (torch.randn(3, 37, generator=gen), torch.randn(3, 37, generator=gen))

    want_logp, want_entropy = reference(logits, targets, temperature)
    (want_grad,) = torch.autograd.grad(objective(want_logp, want_entropy, weights, entropy_grad), logits)
    logp, entropy = vocab_logprobs(logits, targets, temperature)
    (grad,) = torch.autograd.grad(objective(logp, entropy, weights, entropy_grad), logits)

    assert logp.dtype == entropy.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-5)
    # bfloat16 gradients: each side rounds a float32 value once; values that differ in their last float32 bits can
    # round to neighbouring bfloat16 numbers, which lie up to 2^-7 apart (relative).
    tol = {"rtol": 2**-7, "atol": 1e-6} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(grad.float(), want_grad.float(), **tol)
    if extra_positions:
        assert torch.all(grad[:, -1] == 0)


def test_extreme_logits_stay_finite(path: str) -> None:
    """Logits of +-1e4 (one token certain): logp 0 for it, -2e4 for the others, entropy 0, finite gradients."""
    logits = torch.full((1, 2, 4099), -1e4)
    logits[0, 0, 7] = logits[0, 1, 4098] = 1e4
    logits.requires_grad_()
    logp, entropy = vocab_logprobs(logits, torch.tensor([[7, 0]]))
    torch.testing.assert_close(logp, torch.tensor([[0.0, -2e4]]))
    torch.testing.assert_close(entropy, torch.zeros(1, 2))
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    torch.testing.assert_close(logits.grad[0, 1, 0], torch.tensor(1.0))  # onehot - p with p = 0
    torch.testing.assert_close(logits.grad[0, 1, 4098], torch.tensor(-1.0))  # the certain token's p = 1


def test_rows_split_over_threads_agree_with_one_thread() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 301, 2053, generator=gen).requires_grad_()
    targets = torch.randint(0, 2053, (2, 300), generator=gen)
    threads = torch.get_num_threads()
    results = []
    for n in (1, 3):
        torch.set_num_threads(n)
        try:
            logp, entropy = vocab_logprobs(logits, targets)
            (grad,) = torch.autograd.grad(logp.sum() + entropy.sum(), logits)
        finally:
            torch.set_num_threads(threads)
        results.append((logp, entropy, grad))
    for one, many in zip(*results, strict=True):
        assert torch.equal(one, many)


def test_bad_shapes_name_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"logits \[B, L, V\] and targets \[B, T\] with T <= L"):
        vocab_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))

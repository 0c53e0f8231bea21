"""The shared-prompt training forward equals the plain one on every response position: values and gradients."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.models.presets import init_model
from thermik.training import fused_head, shared_prefix
from thermik.training.batch import TokenBatch, token_logprobs
from thermik.training.loss import LossSetup
from thermik.training.shared_prefix import plan_prefixes, token_logprobs_shared
from thermik.training.update import policy_update

PAD = 0


def grouped_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """3 prompts (lengths 7, 12, 4) x 3 samples of responses of different lengths, right-padded, plus one row
    whose prompt no other row shares. Returns (input_ids, attention_mask, prompt_lens, response mask [B, L-1])."""
    gen = torch.Generator().manual_seed(seed)
    rows, prompt_lens = [], []
    for p_len, r_lens in ((7, (5, 1, 9)), (12, (3, 8, 8)), (4, (11, 2, 6)), (9, (4,))):
        prompt = torch.randint(1, vocab, (p_len,), generator=gen).tolist()
        for r_len in r_lens:
            rows.append(prompt + torch.randint(1, vocab, (r_len,), generator=gen).tolist())
            prompt_lens.append(p_len)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    attention = torch.zeros_like(ids)
    response = torch.zeros(len(rows), width - 1)
    for i, (row, p) in enumerate(zip(rows, prompt_lens, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        response[i, p - 1 : len(row) - 1] = 1
    return ids, attention, torch.tensor(prompt_lens), response


@pytest.fixture(scope="module", params=["qwen2-1m", "qwen3-1m", "llama-1m"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = init_model(request.param, Path(tmp_path_factory.mktemp(request.param)), seed=1)
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)


def test_plan_groups_rows_by_identical_prompt() -> None:
    ids, attention, prompt_lens, _ = grouped_batch(vocab=50)
    plan = plan_prefixes(ids, attention, prompt_lens)
    assert plan is not None
    assert plan.group_of_row.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert plan.prompt_lens.tolist() == [7, 12, 4, 9]
    # every row its own prompt: nothing to share, the caller runs the plain forward
    assert plan_prefixes(ids[[0, 3, 6]], attention[[0, 3, 6]], prompt_lens[[0, 3, 6]]) is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_entropy_and_gradients_equal_the_plain_forward(model: torch.nn.Module, temperature: float) -> None:
    ids, attention, prompt_lens, response = grouped_batch(model.config.vocab_size)
    weights = torch.randn(response.shape, generator=torch.Generator().manual_seed(3))

    def loss_and_grads(fn) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logp, entropy = fn()
        ((logp + 0.1 * entropy) * weights * response).sum().backward()
        return logp.detach() * response, entropy.detach() * response, [p.grad.clone() for p in model.parameters()]

    plain = loss_and_grads(lambda: token_logprobs(model, ids, attention, temperature))
    shared = loss_and_grads(lambda: token_logprobs_shared(model, ids, attention, prompt_lens, temperature))
    torch.testing.assert_close(shared[0], plain[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=2e-5, rtol=0)
    # Gradients: the group's prompt gradient is one sum instead of three, so float32 rounding differs slightly.
    for g_shared, g_plain in zip(shared[2], plain[2], strict=True):
        assert (g_shared - g_plain).norm() <= 1e-5 * g_plain.norm() + 1e-7


def test_only_the_trained_positions_reach_the_lm_head(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """`only` (the loss mask, with holes where tool results sit): those positions equal the plain forward's, values
    and gradients of a loss over them; every other position is 0 and the lm head ran on the trained tokens only."""
    ids, attention, prompt_lens, response = grouped_batch(model.config.vocab_size)
    trained = response.clone()
    trained[:, 1::3] = 0  # untrained holes inside the responses
    weights = torch.randn(response.shape, generator=torch.Generator().manual_seed(4))
    results = []
    for fn in (
        lambda: token_logprobs(model, ids, attention, 0.8),
        lambda: token_logprobs_shared(model, ids, attention, prompt_lens, 0.8, only=trained),
    ):
        model.zero_grad()
        logp, entropy = fn()
        ((logp + 0.1 * entropy) * weights * trained).sum().backward()
        results.append((logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain_logp, plain_entropy, plain_grads), (logp, entropy, grads) = results
    torch.testing.assert_close(logp * trained, plain_logp * trained, atol=2e-5, rtol=0)
    torch.testing.assert_close(entropy * trained, plain_entropy * trained, atol=2e-5, rtol=0)
    assert torch.all(logp[trained == 0] == 0) and torch.all(entropy[trained == 0] == 0)
    for g, g_plain in zip(grads, plain_grads, strict=True):
        assert (g - g_plain).norm() <= 1e-5 * g_plain.norm() + 1e-7
    rows_seen = []

    def counting(head: torch.nn.Module, x: torch.Tensor, *args: object) -> object:
        rows_seen.append(x.shape[0])
        return fused_head.head_logprobs(head, x, *args)

    monkeypatch.setattr(shared_prefix, "head_logprobs", counting)
    token_logprobs_shared(model, ids, attention, prompt_lens, only=trained)
    assert rows_seen == [int(trained.sum())]


@pytest.mark.parametrize("shared", [False, True])
def test_entropy_without_a_bonus_builds_no_graph(model: torch.nn.Module, shared: bool) -> None:
    """entropy_grad=False (no entropy bonus): the same values, no graph through the entropy, logp still trains."""
    ids, attention, prompt_lens, _ = grouped_batch(model.config.vocab_size)
    args = (model, ids, attention, prompt_lens) if shared else (model, ids, attention)
    fn = token_logprobs_shared if shared else token_logprobs
    logp, entropy = fn(*args, 1.0, entropy_grad=False)
    logp_g, entropy_g = fn(*args, 1.0)
    assert entropy.grad_fn is None and entropy_g.grad_fn is not None and logp.grad_fn is not None
    torch.testing.assert_close(entropy, entropy_g.detach(), atol=0, rtol=0)
    torch.testing.assert_close(logp, logp_g, atol=0, rtol=0)


def test_does_not_apply_without_a_shared_prompt(model: torch.nn.Module) -> None:
    ids, attention, prompt_lens, _ = grouped_batch(model.config.vocab_size)
    rows = [0, 3, 6, 9]
    assert token_logprobs_shared(model, ids[rows], attention[rows], prompt_lens[rows]) is None


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_policy_update_same_with_and_without_shared_prompts(model: torch.nn.Module, mini_batches: int) -> None:
    """Through `policy_update` (KL to a reference in the loss, old logprobs recomputed when mini_batches > 1):
    the same gradients and metrics either way."""
    ids, attention, prompt_lens, response = grouped_batch(model.config.vocab_size)
    gen = torch.Generator().manual_seed(5)
    adv = torch.randn(len(ids), 1, generator=gen).expand_as(response) * response
    rollout_logp = -torch.rand(response.shape, generator=gen) * response
    alg = AlgorithmConfig(kl={"coef": 0.05, "mode": "loss"}, entropy_coef=0.01)
    ref = copy.deepcopy(model)

    def update(shared: bool) -> tuple[torch.Tensor, dict[str, float]]:
        policy = copy.deepcopy(model)
        opt = torch.optim.SGD(policy.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        trainer = TrainerConfig(micro_batch_size=4, mini_batches=mini_batches, shared_prefix=shared)
        batch = TokenBatch(ids, attention, response, rollout_logp, adv, prompt_lens=prompt_lens)
        metrics = policy_update(policy, ref, batch, LossSetup.from_config(alg, trainer, 1.0), opt, sched)
        return torch.cat([p.grad.flatten() for p in policy.parameters()]), metrics

    (g_shared, m_shared), (g_plain, m_plain) = update(True), update(False)
    assert (g_shared - g_plain).norm() <= 1e-5 * g_plain.norm()
    for key in ("policy/loss", "policy/entropy", "policy/kl", "mismatch/logprob_abs_diff"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-4, abs=1e-6), key


def test_lora_adapters_apply_in_the_shared_forward(tiny_model_dir: Path) -> None:
    """PEFT LoRA layers are the model's own submodules: the shared forward sees the adapters."""
    peft = pytest.importorskip("peft")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # B = 0 at init would make the adapters a no-op
    ids, attention, prompt_lens, response = grouped_batch(base.config.vocab_size)
    plain = token_logprobs(lora, ids, attention)[0] * response
    shared = token_logprobs_shared(lora, ids, attention, prompt_lens)[0] * response
    with lora.disable_adapter():
        without = token_logprobs(lora, ids, attention)[0] * response
    assert (plain - without).abs().max() > 1e-3
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=0)

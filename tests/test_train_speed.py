"""trainer.activation_checkpointing and trainer.compile (training/speed.py): the same logprobs and gradients as the
plain policy, through the trainer's own forward (`batch_logprobs`)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from thermik.errors import ThermikError
from thermik.training.batch import TokenBatch
from thermik.training.speed import apply_train_speed
from thermik.training.update import batch_logprobs


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()


def batch() -> TokenBatch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 250, (3, 12), generator=gen)
    attention = torch.ones_like(ids)
    attention[2, 9:] = 0  # a shorter row
    mask = attention[:, 1:].float()
    return TokenBatch(ids, attention, mask, torch.zeros(3, 11), torch.ones(3, 11), group_ids=torch.arange(3))


def logprobs_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    mb = batch()
    logp, entropy = batch_logprobs(model, mb, 1.0, shared_prefix=False, packing=False)
    ((logp * mb.mask).sum() + 0.1 * (entropy * mb.mask).sum()).backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def check_same(model: torch.nn.Module, **choices: bool) -> list[str]:
    plain, changed = copy.deepcopy(model), copy.deepcopy(model)
    applied = apply_train_speed(changed, **choices)
    want, got = logprobs_and_grads(plain), logprobs_and_grads(changed)
    # float32 within rounding: compiled kernels sum in another order (a gap of 1.3e-5 in one of 34k logprobs seen)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    return applied


def test_activation_checkpointing_keeps_logprobs_and_gradients(model: torch.nn.Module) -> None:
    assert check_same(model, activation_checkpointing=True, compile=False) == ["activation checkpointing"]
    assert apply_train_speed(copy.deepcopy(model), activation_checkpointing=False, compile=False) == []


@pytest.mark.slow
def test_compiled_layers_keep_logprobs_and_gradients(model: torch.nn.Module) -> None:
    applied = check_same(model, activation_checkpointing=False, compile=True)
    assert applied == [f"torch.compile on {model.config.num_hidden_layers} decoder layers"]


def test_a_model_without_decoder_layers_is_refused() -> None:
    with pytest.raises(ThermikError, match="decoder layers"):
        apply_train_speed(torch.nn.Linear(2, 2), activation_checkpointing=False, compile=True)
    with pytest.raises(ThermikError, match="activation checkpointing"):
        apply_train_speed(torch.nn.Linear(2, 2), activation_checkpointing=True, compile=False)


def test_the_learner_applies_the_trainer_settings(tmp_path: Path, tiny_model_dir: Path) -> None:
    """trainer.activation_checkpointing reaches the policy the learner trains (the reference copy stays plain)."""
    from conftest import short_rl_config

    from thermik.models.loading import load_model, load_tokenizer
    from thermik.training.learner import build_learner

    trainer = {"activation_checkpointing": True}
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "speed", "reverse_text", trainer=trainer, algorithm={"kl": {"coef": 0.1}}
    )
    learner = build_learner(cfg, load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)))
    assert learner.policy.is_gradient_checkpointing
    assert learner.ref is not None and not learner.ref.is_gradient_checkpointing

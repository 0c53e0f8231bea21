"""LoRA via PEFT: only adapters train, the engine receives merged weights, the adapter exports in PEFT format."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_algorithms_rl import letter_env, stopping_model_dir  # noqa: F401  (fixtures, used by name)

from tests.conftest import short_rl_config
from thermik.assembly import components
from thermik.config.schema import InferenceConfig, LoRAConfig, ModelConfig, OptimizerConfig
from thermik.models.loading import load_model
from thermik.runs.local import run_rl
from thermik.training.optim import build_optimizer

peft = pytest.importorskip("peft")
from thermik.training.lora import merged_lora_weights  # noqa: E402  (needs peft)

LORA = LoRAConfig(enabled=True, rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _policy_with_random_adapters(model_dir) -> tuple[torch.nn.Module, object]:
    policy, chat = components.load_policy(ModelConfig(path=str(model_dir)), LORA)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:  # B starts at 0 (merged = base); random A and B make the merge non-trivial
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return policy, chat


def test_only_lora_parameters_train(tiny_model_dir) -> None:
    policy, _ = components.load_policy(ModelConfig(path=str(tiny_model_dir)), LORA)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj", "down_proj"}
    optimizer, _ = build_optimizer(policy, OptimizerConfig())
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    with pytest.raises(ValueError, match="does not have: \\['qkv'\\]"):
        bad = LORA.model_copy(update={"target_modules": ("qkv",)})
        components.load_policy(ModelConfig(path=str(tiny_model_dir)), bad)


def test_engine_receives_weights_equal_to_merge_and_unload(tiny_model_dir) -> None:
    policy, chat = _policy_with_random_adapters(tiny_model_dir)
    reference = components.plain_copy(policy).state_dict()  # deepcopy + merge_and_unload: the slow, trusted way
    merged = merged_lora_weights(policy)
    assert len(merged) == 3 * policy.config.num_hidden_layers  # q, v, down in every layer
    for name, w in merged.items():
        torch.testing.assert_close(w, reference[name], rtol=0, atol=1e-6)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[q_proj], load_model(tiny_model_dir).state_dict()[q_proj])
    base_policy, _ = components.load_policy(ModelConfig(path=str(tiny_model_dir)))
    engine = components.build_engine(base_policy, chat, InferenceConfig())
    try:
        assert engine.update_weights_sync(components.engine_weights(policy)) == 1  # names match the engine's model
        engine_state = engine.model.state_dict()
        for name, w in reference.items():
            torch.testing.assert_close(engine_state[name], w, rtol=0, atol=1e-6)
    finally:
        asyncio.run(engine.close())


def test_modules_to_save_train_in_full_and_reach_the_engine(tiny_model_dir) -> None:
    cfg = LORA.model_copy(update={"modules_to_save": ("norm",)})
    policy, _ = components.load_policy(ModelConfig(path=str(tiny_model_dir)), cfg)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    norms = [n for n in trainable if "lora_" not in n]
    assert norms and all(n.endswith("norm.modules_to_save.default.weight") for n in norms)
    with torch.no_grad():  # "training" moves every trainable norm weight
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.1)
    reference = components.plain_copy(policy).state_dict()
    merged = merged_lora_weights(policy)
    assert "model.norm.weight" in merged and "model.layers.0.input_layernorm.weight" in merged
    for name, w in merged.items():
        torch.testing.assert_close(w, reference[name], rtol=0, atol=1e-6)
    base = load_model(tiny_model_dir).state_dict()
    assert not torch.allclose(merged["model.norm.weight"], base["model.norm.weight"])
    with pytest.raises(ValueError, match="matches no module of the model: \\['nrom'\\]"):
        components.load_policy(
            ModelConfig(path=str(tiny_model_dir)), cfg.model_copy(update={"modules_to_save": ("nrom",)})
        )


@pytest.mark.slow
def test_lora_rl_steps_and_exported_adapter_reloads(tmp_path, stopping_model_dir, letter_env) -> None:  # noqa: F811
    cfg = short_rl_config(
        tmp_path,
        stopping_model_dir,
        "lora",
        letter_env,
        train_rows=32,
        eval_rows=4,
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 4, "optimizer": {"lr": 1e-2}},
        lora={"enabled": True, "rank": 4},
        eval={"size": 2, "before": False},
        monitor={"progress": False, "save_trajectories_every": 0},
    )
    run_rl(cfg)
    export = tmp_path / "lora" / "export"
    assert (export / "adapter" / "adapter_config.json").is_file()
    assert (export / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = peft.PeftModel.from_pretrained(load_model(stopping_model_dir), export / "adapter").eval()
    merged = load_model(export)  # the exported HF model holds the merged weights
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=0, atol=1e-4)
        base_logits = load_model(stopping_model_dir)(input_ids=ids).logits
    assert not torch.allclose(merged(input_ids=ids).logits, base_logits, atol=1e-4)  # the adapters trained

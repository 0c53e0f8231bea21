"""LoRA on the policy via PEFT (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

Only the adapters train; the engine never sees them: it holds a plain causal LM and receives, at each weight
sync, the merged weights W + B @ A * (alpha / r) of the adapted Linear layers under the base model's own
parameter names (the other weights are frozen, so they never need sending). The adapter is saved in PEFT format.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import Linear as LoraLinear
from peft.utils import ModulesToSaveWrapper

from thermik.config.schema import LoRAConfig

ADAPTER_NAME = "default"


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> PeftModel:
    """`model` wrapped with fresh adapters (B = 0, so the wrapped model computes exactly what `model` did)."""
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = sorted(set(cfg.target_modules) - names)
    if missing:
        raise ValueError(
            f"lora.target_modules names modules the model does not have: {missing}; its Linear layers are "
            f"{sorted(names)}"
        )
    all_names = [name for name, _ in model.named_modules()]
    unmatched = [m for m in cfg.modules_to_save if not any(name.endswith(m) for name in all_names)]
    if unmatched:
        raise ValueError(f"lora.modules_to_save matches no module of the model: {unmatched}")
    peft_cfg = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        modules_to_save=list(cfg.modules_to_save) or None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg, adapter_name=ADAPTER_NAME)


def is_lora(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


@torch.no_grad()
def merged_lora_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    """{base parameter name: W + B @ A * scaling} for every adapted Linear layer, and the trained copies of
    `lora.modules_to_save`: the only weights that differ from the frozen base, named as in the base model's
    state dict (what the engine's model holds)."""
    out: dict[str, torch.Tensor] = {}
    for name, module in model.get_base_model().named_modules():
        if isinstance(module, ModulesToSaveWrapper):  # trained in full (lora.modules_to_save): sent as they are
            trained = module.modules_to_save[ADAPTER_NAME]
            out.update((f"{name}.{key}", value.detach().clone()) for key, value in trained.state_dict().items())
            continue
        if not isinstance(module, LoraLinear) or ADAPTER_NAME not in module.lora_A:
            continue
        if module.fan_in_fan_out:  # transposed storage (GPT-2 Conv1D): not used by the architectures we load
            raise ValueError(f"merged_lora_weights: {name} stores its weight transposed; not supported")
        a, b = module.lora_A[ADAPTER_NAME].weight, module.lora_B[ADAPTER_NAME].weight
        base = module.get_base_layer().weight
        out[f"{name}.weight"] = (base + (b @ a) * module.scaling[ADAPTER_NAME]).to(base.dtype)
    return out


def merged_model(model: PeftModel) -> torch.nn.Module:
    """A plain causal LM with the adapters merged in (a copy; `model` keeps its adapters)."""
    return copy.deepcopy(model).merge_and_unload()


def save_adapter(model: PeftModel, out: Path) -> None:
    """The adapter in PEFT format: adapter_config.json + adapter_model.safetensors (PeftModel.from_pretrained)."""
    model.save_pretrained(out, safe_serialization=True)

"""One base model, many LoRA adapters (one per Tinker training client), each with its own AdamW.

PEFT holds every adapter on the one base model; `set_adapter` picks the one a batch trains. Gradients accumulate
on an adapter's parameters across `forward_backward` calls until its `optim_step` (Tinker's semantics). Every
method runs on the service's single worker thread.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from thermik.atomic import publish_dir
from thermik.models.loading import load_model
from thermik.tinker.losses import compute_loss
from thermik.tinker.wire import Datum
from thermik.training.mixed_precision import set_lm_head_precision, train_autocast
from thermik.training.vocab_logprobs import vocab_logprobs

LORA_ALPHA = 32.0  # Tinker scales every rank's update by a fixed alpha
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
ADAPTER_FILE = "adapter.safetensors"
LORA_FILE = "lora.json"


@dataclass
class Adapter:
    lora: dict[str, Any]
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW
    steps: int = 0


@dataclass
class FwdBwdPart:
    """One request's slice of a batched forward_backward."""

    data: list[Datum]
    outputs: list[dict[str, Any]] | None = None
    metrics: dict[str, float] | None = None


def lora_targets(lora: dict[str, Any]) -> list[str]:
    targets = [
        *(ATTN_MODULES if lora.get("train_attn", True) else ()),
        *(MLP_MODULES if lora.get("train_mlp", True) else ()),
    ]
    if not targets:
        raise ValueError("lora_config trains nothing: set train_attn or train_mlp")
    return targets


class Trainer:
    def __init__(
        self,
        model_dir: Path,
        dtype: str = "float32",
        device: str = "cpu",
        autocast: torch.dtype | None = None,
        lm_head_precision: str = "auto",
    ) -> None:
        """autocast: bfloat16 runs forward_backward in mixed precision, with the lm head in `lm_head_precision`
        (thermik.training.mixed_precision)."""
        base = load_model(model_dir, dtype=dtype, device=device).requires_grad_(False)
        if autocast is not None:
            print(
                f"thermik tinker trainer: lm head in {set_lm_head_precision(base, lm_head_precision)}", file=sys.stderr
            )
        self.plain = copy.deepcopy(base)  # never wrapped: sampler engines start from copies of it
        self.vocab_size = int(base.get_input_embeddings().weight.shape[0])
        self.max_len = int(base.config.max_position_embeddings)
        self.device = next(base.parameters()).device
        self.autocast = autocast
        self._base = base
        self.peft: PeftModel | None = None
        self.adapters: dict[str, Adapter] = {}

    def create(self, model_id: str, lora: dict[str, Any]) -> None:
        """A fresh adapter (B = 0: it starts as the base model), initialised from `lora['seed']`."""
        cfg = peft_config(lora)
        torch.manual_seed(int(lora["seed"]))
        if self.peft is None:
            self.peft = get_peft_model(self._base, cfg, adapter_name=model_id)
        else:
            self.peft.add_adapter(model_id, cfg)
        params = [p for n, p in self.peft.named_parameters() if f".{model_id}." in n]
        for p in params:
            p.requires_grad_(True)
        self.adapters[model_id] = Adapter(lora=dict(lora), params=params, optimizer=torch.optim.AdamW(params))

    def unload(self, model_id: str) -> None:
        assert self.peft is not None
        self.adapters.pop(model_id)
        self.peft.delete_adapter(model_id)

    def _activate(self, model_id: str) -> PeftModel:
        assert self.peft is not None
        self.peft.base_model.set_adapter(model_id)
        for p in self.adapters[model_id].params:  # set_adapter may reset requires_grad
            p.requires_grad_(True)
        return self.peft

    def forward_backward(
        self, model_id: str, loss_fn: str, config: dict[str, float | str], parts: list[FwdBwdPart], forward_only: bool
    ) -> None:
        """One forward (and backward) over every datum of `parts`; fills each part's outputs and metrics."""
        model = self._activate(model_id)
        data = [d for part in parts for d in part.data]
        width = max(len(d.tokens) for d in data)

        def pad(key: str, dtype: torch.dtype) -> torch.Tensor:
            rows = [torch.as_tensor(d.inputs[key] if key else d.tokens).reshape(-1).to(dtype) for d in data]
            return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows]).to(self.device)

        tokens, targets = pad("", torch.long), pad("target_tokens", torch.long)
        mask = torch.stack([torch.arange(width) < len(d.tokens) for d in data]).float().to(self.device)
        inputs = {k: pad(k, torch.float32) for k in ("weights", "logprobs", "advantages") if k in data[0].inputs}
        with torch.set_grad_enabled(not forward_only):
            with train_autocast(model, self.autocast):
                logits = model(input_ids=tokens, attention_mask=mask.long()).logits
            logp, _ = vocab_logprobs(logits, targets)
            result = compute_loss(loss_fn, config, logp, inputs, mask)
            if not forward_only:
                result.loss.backward()
        self._split(parts, logp.detach().cpu(), result.per_token.detach().cpu(), result.metrics)

    @staticmethod
    def _split(parts: list[FwdBwdPart], logp: torch.Tensor, per_token: torch.Tensor, batch: dict[str, float]) -> None:
        row = 0
        for part in parts:
            outputs = []
            for d in part.data:
                n = len(d.tokens)
                outputs.append({"logprobs": logp[row, :n].numpy(), "elementwise_loss": per_token[row, :n].numpy()})
                row += 1
            loss = float(sum(float(o["elementwise_loss"].sum()) for o in outputs))
            part.outputs = outputs
            part.metrics = {"loss:sum": loss, **{f"{k}:mean": v for k, v in batch.items()}}

    def optim_step(self, model_id: str, adam: dict[str, float]) -> dict[str, float]:
        """AdamW with the request's hyper-parameters on the accumulated gradients, then zero them."""
        adapter = self.adapters[model_id]
        grads = [p.grad for p in adapter.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        if adam.get("grad_clip_norm", 0.0) > 0 and grads:
            torch.nn.utils.clip_grad_norm_(adapter.params, adam["grad_clip_norm"])
        for group in adapter.optimizer.param_groups:
            group.update(
                lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                weight_decay=adam["weight_decay"],
            )  # fmt: skip
        adapter.optimizer.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        adapter.steps += 1
        return {"grad_norm:mean": norm, "step:max": float(adapter.steps)}

    def save_state(self, model_id: str, directory: Path, optimizer: bool = True) -> int:
        """Adapter weights and LoRA config (and the optimizer state) in `directory`, written atomically; bytes."""
        assert self.peft is not None
        adapter = self.adapters[model_id]
        state = get_peft_model_state_dict(self.peft, adapter_name=model_id)

        def write(tmp: Path) -> None:
            save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / ADAPTER_FILE))
            (tmp / LORA_FILE).write_text(json.dumps(adapter.lora))
            if optimizer:
                torch.save(adapter.optimizer.state_dict(), tmp / "optimizer.pt")

        publish_dir(directory, write)
        return sum(f.stat().st_size for f in directory.iterdir())

    def load_state(self, model_id: str, directory: Path, optimizer: bool) -> None:
        assert self.peft is not None
        saved = json.loads((directory / LORA_FILE).read_text())
        have = self.adapters[model_id].lora
        if int(saved["rank"]) != int(have["rank"]) or lora_targets(saved) != lora_targets(have):
            raise ValueError(
                f"checkpoint LoRA (rank {saved['rank']}) does not match this model's (rank {have['rank']})"
            )
        state = load_file(str(directory / ADAPTER_FILE))
        set_peft_model_state_dict(self.peft, state, adapter_name=model_id)
        if optimizer:
            self.adapters[model_id].optimizer.load_state_dict(torch.load(directory / "optimizer.pt"))

    def save_sampler(self, model_id: str, directory: Path) -> int:
        """The adapter alone (no optimizer state): a sampler merges it into a copy of the base (`merged_copy`)."""
        return self.save_state(model_id, directory, optimizer=False)


def peft_config(lora: dict[str, Any]) -> LoraConfig:
    targets = lora_targets(lora)
    return LoraConfig(r=int(lora["rank"]), lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets, bias="none")


def merged_copy(plain: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """A copy of the base model with the adapter saved in `directory` merged in (W + B A * alpha / r)."""
    lora = json.loads((directory / LORA_FILE).read_text())
    model = get_peft_model(copy.deepcopy(plain), peft_config(lora))
    set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_FILE)))
    return model.merge_and_unload()

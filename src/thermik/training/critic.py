"""The critic of PPO with GAE: a value model trained with the clipped value loss by its own optimizer.

Design: a *separate* model, a copy of the policy's backbone (the decoder stack loaded from the same model
directory, without the LM head) plus a linear head hidden -> 1. Separate rather than a head on the policy so
that the policy stays an unmodified causal LM (weight sync, export and LoRA see nothing new), the value loss
cannot disturb the policy's representation, and each model has its own optimizer and learning rate (the usual
PPO-for-LLMs layout: OpenRLHF, verl). The head starts at zero, so every value starts at 0.

Values are aligned like every per-token tensor (`training/batch.py`): position t holds V of the state whose
next token is input_ids[t + 1], i.e. the head applied to the hidden state at t.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from thermik.algorithms.reductions import token_mean
from thermik.algorithms.value_loss import clipped_value_loss
from thermik.config.schema import CriticConfig, ModelConfig
from thermik.models.loading import load_model
from thermik.training.batch import TokenBatch, model_device
from thermik.training.optim import build_optimizer

WEIGHTS_FILE = "critic.safetensors"
OPTIMIZER_FILE = "critic_optimizer.pt"


class ValueModel(torch.nn.Module):
    """backbone (a transformers decoder returning last_hidden_state) + linear value head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values [B, L-1] (aligned with input_ids[:, 1:]), in float32."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(hidden[:, :-1]).squeeze(-1).float()


class Critic:
    """The value model with its optimizer: `values` before advantages, `update` after, `save`/`load` with a
    checkpoint."""

    def __init__(self, model: ValueModel, cfg: CriticConfig, micro_batch_size: int) -> None:
        self.model, self.cfg, self.micro = model, cfg, micro_batch_size
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optimizer)

    @classmethod
    def from_config(cls, model_cfg: ModelConfig, cfg: CriticConfig, micro_batch_size: int) -> Critic:
        lm = load_model(model_cfg.path, dtype=model_cfg.dtype, device=model_cfg.device)
        head_dtype = next(lm.parameters()).dtype
        model = ValueModel(lm.get_decoder(), lm.config.hidden_size).to(device=model_cfg.device, dtype=head_dtype)
        return cls(model, cfg, micro_batch_size)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """V [B, L-1] of the batch (0 off the mask), micro-batch by micro-batch."""
        self.model.eval()
        out = torch.zeros_like(batch.mask)
        device = model_device(self.model)
        for start in range(0, len(batch), self.micro):
            mb = batch.slice(start, start + self.micro).to(device)
            out[start : start + self.micro] = self.model(mb.input_ids, mb.attention_mask) * mb.mask
        return out

    def update(self, batch: TokenBatch) -> dict[str, float]:
        """Clipped value-loss steps on the batch (batch.values: old values, batch.returns: GAE returns); the
        token_mean normaliser is the whole mini-batch's, so micro-batching does not change the gradient."""
        if batch.values is None or batch.returns is None:
            raise ValueError("Critic.update needs batch.values and batch.returns (assign_advantages sets them)")
        self.model.train()
        batch = batch.to(model_device(self.model))
        sums: dict[str, float] = defaultdict(float)
        per_mini = -(-len(batch) // self.cfg.mini_batches)
        for m_start in range(0, len(batch), per_mini):
            mini = batch.slice(m_start, m_start + per_mini)
            normalizer = max(mini.num_tokens, 1)
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(mini), self.micro):
                mb = mini.slice(start, start + self.micro)
                values = self.model(mb.input_ids, mb.attention_mask)
                assert mb.values is not None and mb.returns is not None
                loss, m = clipped_value_loss(
                    values,
                    mb.values,
                    mb.returns,
                    mb.mask,
                    self.cfg.value_clip,
                    lambda x, mask, n=normalizer: token_mean(x, mask, normalizer=n),
                )
                loss.backward()
                sums["critic/loss"] += float(loss.detach()) / self.cfg.mini_batches
                for key, value in m.items():
                    sums[key] += value * mb.num_tokens / max(batch.num_tokens, 1)
            max_norm = self.cfg.optimizer.max_grad_norm
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
            self.optimizer.step()
            self.scheduler.step()
            sums["critic/grad_norm"] += grad_norm / self.cfg.mini_batches
        return dict(sums)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE))
        opt = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(opt, directory / OPTIMIZER_FILE)

    def load(self, directory: Path) -> None:
        if not (directory / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(
                f"{directory} has no {WEIGHTS_FILE}: the checkpoint was written without a critic "
                "(resume it with the advantage estimator it was trained with, or start a new run)"
            )
        self.model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)))
        opt = torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])

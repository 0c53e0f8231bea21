"""A reward model: an HF sequence-classification model (one label) scores each episode's final response.

The input is the episode's prompt messages plus its last assistant message, rendered by the reward model's own
chat template (or as "role: content" lines when it has none), cut to `max_length` tokens from the left so the
response stays. The score is the model's logit, or its sigmoid (`normalize`). Runs in a worker thread, in batches.
A score that is NaN or infinite counts as unanswered (`reward_model/failures`, `reward_model/nonfinite`), like a
judge request that failed: model_rewards.py keeps such groups out of training.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

from thermik.config.schema import RewardModelConfig
from thermik.errors import ThermikError
from thermik.models.loading import load_tokenizer
from thermik.rollout.judge import Episode, Scores, as_text


class RewardModel:
    setting = "rewards.reward_model"

    def __init__(self, cfg: RewardModelConfig) -> None:
        if not Path(cfg.path, "config.json").is_file():
            raise ThermikError(
                f"rewards.reward_model.path {cfg.path!r} is not a HF model directory (no config.json)",
                hint="point it at a sequence-classification model saved with save_pretrained",
            )
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.path)
        self.tokenizer.truncation_side = "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(cfg.path, local_files_only=True).eval()
        if self.model.config.num_labels != 1:
            raise ThermikError(
                f"rewards.reward_model.path {cfg.path}: a reward model has one label (a score), this one has "
                f"{self.model.config.num_labels}"
            )
        self.first_failure: str | None = None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.tokenizer.pad_token_id = pad
        self.model.config.pad_token_id = pad  # the classifier reads each row's last non-pad token

    def text(self, episode: Episode) -> str:
        final = [m for m in episode.response if m.get("role") == "assistant"][-1:]
        messages = episode.prompt + final
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return as_text(messages)

    def hint(self) -> str:
        return f"check the reward model at rewards.reward_model.path ({self.cfg.path}): it scored NaN or inf"

    async def score(self, episodes: list[Episode]) -> Scores:
        t0 = time.perf_counter()
        scores = await asyncio.to_thread(self._score, [self.text(e) for e in episodes])
        answered = [math.isfinite(s) for s in scores]
        finite = [s for s, ok in zip(scores, answered, strict=True) if ok]
        metrics = {"reward_model/failures": float(len(scores) - len(finite))}
        if len(finite) < len(scores):
            metrics["reward_model/nonfinite"] = metrics["reward_model/failures"]
            self.first_failure = self.first_failure or f"a score of {next(s for s in scores if not math.isfinite(s))}"
        if finite:
            metrics["reward_model/score_mean"] = sum(finite) / len(finite)
        metrics["time/reward_model"] = time.perf_counter() - t0
        return Scores([s if ok else 0.0 for s, ok in zip(scores, answered, strict=True)], answered, metrics)

    @torch.no_grad()
    def _score(self, texts: list[str]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(texts), self.cfg.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.cfg.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.cfg.max_length,
                add_special_tokens=False,
            )
            logits = self.model(**enc).logits[:, 0].float()
            out += (torch.sigmoid(logits) if self.cfg.normalize == "sigmoid" else logits).tolist()
        return out

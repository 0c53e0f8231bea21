"""The inference-engine contract shared by every backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import torch

StopReason = Literal["stop", "length", "abort"]

WeightSource = dict[str, torch.Tensor] | Path
"""A state dict (tensors are copied in place) or a directory holding *.safetensors."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    """One sampled continuation. logprobs[i] is log p(token_ids[i]) under softmax(logits / temperature)
    (temperature 1 when greedy), computed by the weights of version weight_versions[i]."""

    token_ids: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    weight_version: int
    weight_versions: list[int] = field(default_factory=list)


class InferenceEngine(Protocol):
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation: ...

    async def update_weights(self, source: WeightSource) -> int: ...

    @property
    def weight_version(self) -> int: ...

    async def close(self) -> None: ...

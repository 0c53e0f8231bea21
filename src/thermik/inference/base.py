"""The inference-engine contract shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

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
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends once the decoded continuation contains one (the engine needs a detokenizer);
    the returned tokens run up to and including the token that completed the string."""
    seed: int | None = None
    top_logprobs: int = 0
    """If > 0, Generation.top_logprobs holds, per sampled token, the this-many most likely token ids and logprobs."""


@dataclass
class Generation:
    """One sampled continuation. logprobs[i] is log p(token_ids[i]) under softmax(logits / temperature)
    (temperature 1 when greedy), computed by the weights of version weight_versions[i]."""

    token_ids: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    weight_version: int
    weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None


@dataclass
class TokenDelta:
    """Tokens sampled since the previous delta of a streamed generation (`EmbeddedEngine.stream`)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None = None


StreamItem = TokenDelta | Generation
"""What a stream yields: deltas while the generation runs, then the whole `Generation` once, last."""


class InferenceEngine(Protocol):
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation: ...

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Load new weights; returns their version: the next one, or `version` (a resumed run's first push: the
        weights of its checkpoint step), counted on from there."""
        ...

    @property
    def weight_version(self) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class InProcessKVCache(Protocol):
    """What an engine whose KV cache lives in this process's memory (the embedded engine) also offers a run: a check
    at start that the cache budget holds the longest sequence, and a way to free idle cached prefixes when a
    synchronous step's sampling ends, before the trainer's memory peak. Runs test for it with `isinstance`."""

    def require_room(self, positions: int, key: str = "rollout.max_sequence_length") -> None:
        """Raise `KVCacheBudgetError` when the budget cannot hold one sequence of `positions` (`key`: the setting
        they come from)."""
        ...

    def release_idle_cache(self) -> None:
        """Drop cached prefixes no running request uses and give their memory back."""
        ...


def next_version(current: int, version: int | None) -> int:
    """The version of newly loaded weights: `version` when given (a resumed run's step), else the next one."""
    return current + 1 if version is None else version


def check_request(prompt_ids: Sequence[int], sampling: SamplingParams, vocab_size: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: the engine needs at least one prompt token")
    if sampling.max_tokens < 1:
        raise ValueError(f"sampling.max_tokens must be >= 1, got {sampling.max_tokens}")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_ids holds ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")

"""What the embedded engine schedules: a queued or running request, and the cache row (slot) that holds one."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from thermik.inference.base import Generation, SamplingParams, StopReason

Detokenize = Callable[[list[int]], str]


@dataclass
class Request:
    """One generation: its prompt, its sampling, and the tokens, logprobs and weight versions sampled so far."""

    prompt_ids: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: concurrent.futures.Future[Generation]
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    on_token: Callable[[], None] | None = None  # called by the scheduler thread after each sampled token

    def result(self, reason: StopReason, version: int) -> Generation:
        return Generation(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            stop_reason=reason,
            weight_version=self.versions[-1] if self.versions else version,
            weight_versions=self.versions,
            top_logprobs=self.top_logprobs if self.sampling.top_logprobs else None,
        )

    def finish(self, reason: StopReason, version: int) -> None:
        """Hand the caller its `Generation` (`version`: the weights' when it sampled nothing); once only."""
        if not self.future.done():
            self.future.set_result(self.result(reason, version))


@dataclass
class Slot:
    """One cache row. `tokens` are the ids whose keys/values it holds; they stay valid after the request ends,
    so a later prompt with the same prefix reuses them (until the slot is given to another request)."""

    tokens: list[int] = field(default_factory=list)
    request: Request | None = None
    next_token: int = 0  # sampled, not yet fed to the model
    session_id: str | None = None
    last_used: int = 0


@dataclass
class Counters:
    """The engine's work so far, for tests and benchmarks."""

    batches: int = 0  # admission rounds that ran a prefill
    forwards: int = 0
    prefill_tokens: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

"""Sampling for Tinker sampling sessions: one embedded engine per set of sampler weights (LRU): a copy of the base
model with the adapter of a `save_weights_for_sampler` checkpoint merged in."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thermik.inference.base import SamplingParams
from thermik.inference.embedded import embedded_engine
from thermik.tinker.trainer import merged_copy
from thermik.tinker.wire import Sequence
from thermik.training.vocab_logprobs import vocab_logprobs

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class SampleJob:
    prompt: list[int]
    num_samples: int
    params: dict[str, Any]  # the request's sampling_params (Tinker field names)
    prompt_logprobs: bool
    prompt_logprobs_last_n: int | None = None


def engine_params(params: dict[str, Any], room: int) -> SamplingParams:
    """thermik SamplingParams from Tinker's: stop is a string, strings or token ids; top_k -1 means none."""
    stop = params.get("stop")
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
    return SamplingParams(
        max_tokens=max(1, min(int(max_tokens), room)),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=max(0, int(params.get("top_k", -1))),
        stop_token_ids=tuple(int(s) for s in stop if not isinstance(s, str)),
        stop=tuple(s for s in stop if isinstance(s, str)),
        seed=params.get("seed"),
    )


class Samplers:
    """Engines by sampler-weights directory (None: the base model), at most `max_engines` alive."""

    def __init__(self, plain: torch.nn.Module, tokenizer: Any, max_engines: int = 3, seed: int = 0) -> None:
        self._plain, self._tokenizer, self._max, self._seed = plain, tokenizer, max_engines, seed
        self._engines: OrderedDict[str | None, Any] = OrderedDict()
        self._busy: dict[str | None, int] = {}
        self._lock = asyncio.Lock()
        self.max_len = int(plain.config.max_position_embeddings)

    def _build(self, weights_dir: str | None) -> Any:
        model = copy.deepcopy(self._plain) if weights_dir is None else merged_copy(self._plain, Path(weights_dir))
        tok = self._tokenizer
        stop_ids = sorted({tok.eos_token_id, tok.pad_token_id} - {None})
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return embedded_engine(model, eos_token_ids=stop_ids, pad_token_id=pad, seed=self._seed, detokenize=tok.decode)

    async def engine(self, weights_dir: str | None) -> Any:
        """The engine for `weights_dir`, marked busy (the caller calls `release`); idle ones past the limit close."""
        async with self._lock:
            if weights_dir not in self._engines:
                self._engines[weights_dir] = await asyncio.to_thread(self._build, weights_dir)
            self._engines.move_to_end(weights_dir)
            self._busy[weights_dir] = self._busy.get(weights_dir, 0) + 1
            idle = [k for k in self._engines if not self._busy.get(k)]  # least recently used first
            for key in idle[: max(0, len(self._engines) - self._max)]:  # a busy engine is never closed under a request
                await self._engines.pop(key).close()
            return self._engines[weights_dir]

    def release(self, weights_dir: str | None) -> None:
        self._busy[weights_dir] -= 1

    async def sample(self, weights_dir: str | None, job: SampleJob) -> tuple[list[Sequence], list[float] | None]:
        engine = await self.engine(weights_dir)
        try:
            return await self._sample(engine, job)
        finally:
            self.release(weights_dir)

    async def _sample(self, engine: Any, job: SampleJob) -> tuple[list[Sequence], list[float] | None]:
        base = engine_params(job.params, self.max_len - len(job.prompt))
        seeds = [None if base.seed is None else base.seed + i for i in range(job.num_samples)]
        gens = await asyncio.gather(
            *(engine.generate(list(job.prompt), _with_seed(base, s)) for s in seeds)
        )  # fmt: skip
        sequences = [Sequence(g.token_ids, g.logprobs, "length" if g.stop_reason == "length" else "stop") for g in gens]
        if any(g.stop_reason == "abort" for g in gens):
            raise RuntimeError("sampling was aborted (the engine is shutting down)")
        if not job.prompt_logprobs:
            return sequences, None
        prompt_lp = await asyncio.to_thread(_prompt_logprobs, engine.model, job.prompt)
        if job.prompt_logprobs_last_n is not None:  # positions before the last n carry no logprob (NaN -> None)
            cut = len(prompt_lp) - job.prompt_logprobs_last_n
            prompt_lp = [float("nan")] * cut + prompt_lp[cut:]
        return sequences, prompt_lp

    async def close(self) -> None:
        for engine in self._engines.values():
            await engine.close()
        self._engines.clear()


def _with_seed(params: SamplingParams, seed: int | None) -> SamplingParams:
    return dataclasses.replace(params, seed=seed)


@torch.no_grad()
def _prompt_logprobs(model: torch.nn.Module, prompt: list[int]) -> list[float]:
    """log p(prompt[i] | prompt[:i]) for i >= 1; NaN at 0 (no context), which the SDK reads as None."""
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    lp, _ = vocab_logprobs(model(input_ids=ids).logits, ids[:, 1:])
    return [float("nan"), *lp[0].cpu().tolist()]

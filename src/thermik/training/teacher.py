"""The teacher of on-policy distillation: scores every token of the student's sampled sequences.

Two kinds, chosen by `algorithm.teacher.source` (docs/algorithms.md, "On-policy distillation"):

- a local HF model directory: a frozen copy in the trainer's process, run by the training forward (like the
  reference model);
- `http://host:port`: an OpenAI-compatible server; each sequence goes to `/v1/completions` as token ids with
  `prompt_logprobs: 0` (vLLM's extension, served by `thermik inference`), so the teacher sees exactly the ids the
  student sampled, never re-tokenized text.

Both return logprobs [B, L-1] aligned like `TokenBatch.mask` at temperature 1; only the masked (sampled) positions
are used.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httpx
import torch

from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.served import first_served_model
from thermik.training.batch import TokenBatch
from thermik.training.update import logprobs_no_grad

TEACHER_MODEL = "algorithm.teacher.model"


class Teacher(Protocol):
    async def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """log q(token t+1 | tokens <= t) [B, L-1] of the batch's sequences."""
        ...


class LocalTeacher:
    """A frozen model in this process, run micro-batch by micro-batch in the training forward's precision."""

    def __init__(self, model: torch.nn.Module, trainer: TrainerConfig, autocast: torch.dtype | None) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.trainer, self.autocast = trainer, autocast

    async def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        t = self.trainer
        args = (t.micro_batch_size, 1.0, t.shared_prefix, self.autocast, t.packing)
        return await asyncio.to_thread(logprobs_no_grad, self.model, batch, *args)


class ServerTeacher:
    """An OpenAI-compatible server: one `/v1/completions` request with `prompt_logprobs: 0` per sequence."""

    def __init__(self, base_url: str, model: str, api_key: str, timeout_s: float, concurrency: int) -> None:
        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.concurrency = concurrency

    async def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        lengths = batch.attention_mask.sum(dim=-1).tolist()
        rows = [batch.input_ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
        gate = asyncio.Semaphore(self.concurrency)
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
                model = self.model = self.model or await first_served_model(client, self.base_url, TEACHER_MODEL)
                scored = await asyncio.gather(*(self._score(client, gate, model, ids) for ids in rows))
        except httpx.TransportError as exc:  # down, refused, timed out: distillation cannot go on without it
            raise RuntimeError(
                f"algorithm.teacher.source {self.base_url} did not answer ({type(exc).__name__}: {exc}); start it, "
                f"e.g. `thermik inference --model.path TEACHER_DIR --server.port PORT`, or raise "
                f"algorithm.teacher.timeout_s ({self.timeout_s} s)"
            ) from exc
        out = torch.zeros(batch.mask.shape)
        for i, values in enumerate(scored):
            out[i, : len(values)] = torch.tensor(values)
        return out

    async def _score(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, model: str, ids: list[int]) -> list:
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
        async with gate:
            reply = await client.post(f"{self.base_url}/v1/completions", json=body)
        if reply.status_code != 200:
            raise RuntimeError(
                f"teacher {self.base_url} answered {reply.status_code} to a prompt_logprobs request: {reply.text[:500]}"
            )
        entries = reply.json()["choices"][0].get("prompt_logprobs")
        if entries is None or len(entries) != len(ids):
            raise RuntimeError(
                f"teacher {self.base_url} returned no prompt_logprobs for {len(ids)} tokens: does it support them "
                "(thermik inference, vLLM)?"
            )
        return [entry[str(t)]["logprob"] for t, entry in zip(ids[1:], entries[1:], strict=True)]


def build_teacher(
    alg: AlgorithmConfig, trainer: TrainerConfig, tokenizer: Any, autocast: torch.dtype | None, device: str
) -> Teacher | None:
    """The teacher `algorithm.teacher.source` names, or None when distillation is off. tokenizer: the student's (HF)
    tokenizer; a local teacher must share its vocabulary."""
    if not alg.teacher.source:
        return None
    if alg.teacher.source.startswith(("http://", "https://")):
        return ServerTeacher(
            alg.teacher.source, alg.teacher.model, alg.teacher.api_key, alg.teacher.timeout_s, alg.teacher.concurrency
        )
    vocab = load_tokenizer(alg.teacher.source).get_vocab()
    if vocab != tokenizer.get_vocab():
        raise ValueError(
            f"algorithm.teacher.source {alg.teacher.source}: its tokenizer differs from the student's ({len(vocab)} vs "
            f"{len(tokenizer.get_vocab())} tokens); distillation scores the student's token ids, so both must "
            "share one tokenizer"
        )
    return LocalTeacher(load_model(alg.teacher.source, device=device), trainer, autocast)

"""The fallback engine for architectures the native forward does not cover: static batches on transformers.

Concurrent `generate` calls are queued and served together: a background task takes everything queued,
runs one static batch (`generate_batch`, a left-padded decode loop over the model's own DynamicCache, which
gives the same tokens as `model.generate`) in a worker thread so the event loop stays free for tool calls,
and resolves each caller's future. No continuous batching, no session reuse, no stop strings.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from thermik.cpu.openmp import to_thread_releasing
from thermik.inference.base import Generation, SamplingParams, StopReason, WeightSource, check_request, next_version
from thermik.inference.sampling import process_logits, sample, token_logprobs
from thermik.inference.weights import check_state, copy_state, load_state


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Generation]


@dataclass
class _Rows:
    """Per-row state of one decode batch."""

    sampling: list[SamplingParams]
    stop_ids: list[frozenset[int]]
    generators: list[torch.Generator | None]
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    token_ids: list[list[int]]
    logprobs: list[list[float]]
    versions: list[list[int]]
    stop_reason: list[StopReason | None]


class HFEngine:
    """InferenceEngine over any Hugging Face causal LM living in this process (static batches)."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = 0
        # One lock around decoding and weight updates: a batch never sees half-copied weights.
        self._model_lock = threading.Lock()
        self._abort = threading.Event()
        self._closed = False
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._server: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Counters for tests and benchmarks.
        self.num_batches = 0
        self.num_forwards = 0

    @property
    def weight_version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ async API

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        """Queue one request; it is decoded together with whatever else is queued. session_id is unused yet."""
        if self._closed:
            raise RuntimeError("engine is closed")
        check_request(prompt_ids, sampling, self._vocab_size)
        self._ensure_server()
        assert self._wakeup is not None
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_ids), sampling, future))
        self._wakeup.set()
        return await future

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Copy new weights in place (waits for the running batch to finish). Returns the new version (`version`
        when given)."""
        return await to_thread_releasing(self.update_weights_sync, source, version)

    async def close(self) -> None:
        """Stop serving: the running batch ends with stop_reason "abort", queued requests get "abort" too."""
        self._closed = True
        self._abort.set()
        if self._server is not None and self._wakeup is not None:
            self._wakeup.set()
            await self._server
            self._server = None
        for req in self._pending:
            if not req.future.done():
                req.future.set_result(self._aborted())
        self._pending.clear()

    # ------------------------------------------------------------------ request handling

    def _ensure_server(self) -> None:
        loop = asyncio.get_running_loop()
        if self._server is not None and self._loop is loop and not self._server.done():
            return
        # First call, or the engine is reused from a new event loop (e.g. successive asyncio.run calls).
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._pending = [r for r in self._pending if not r.future.done() and r.future.get_loop() is loop]
        self._server = loop.create_task(self._serve(), name="thermik-embedded-engine")

    async def _serve(self) -> None:
        assert self._wakeup is not None
        while not self._closed:
            await self._wakeup.wait()
            await self._gather_window()
            self._wakeup.clear()
            if self._closed:
                break
            batch = [r for r in self._pending[: self.max_batch_size] if not r.future.done()]
            del self._pending[: self.max_batch_size]
            if self._pending:
                self._wakeup.set()
            if not batch:
                continue
            try:
                results = await asyncio.to_thread(
                    self.generate_batch, [r.prompt_ids for r in batch], [r.sampling for r in batch]
                )
            except Exception as exc:  # a failed batch fails its callers, not the server
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)
                continue
            for req, result in zip(batch, results, strict=True):
                if not req.future.done():
                    req.future.set_result(result)

    async def _gather_window(self, quiet_s: float = 0.002, max_wait_s: float = 0.02) -> None:
        """Wait until no new request arrived for `quiet_s` (at most `max_wait_s`): episodes return from their
        tool calls at slightly different times, and one batch for all of them beats a batch per straggler."""
        await asyncio.sleep(0)
        deadline = time.perf_counter() + max_wait_s
        seen = -1
        while len(self._pending) != seen and len(self._pending) < self.max_batch_size:
            seen = len(self._pending)
            if time.perf_counter() >= deadline:
                break
            await asyncio.sleep(quiet_s)

    def _aborted(self) -> Generation:
        return Generation(token_ids=[], logprobs=[], stop_reason="abort", weight_version=self._version)

    # ------------------------------------------------------------------ weights

    def update_weights_sync(self, source: WeightSource, version: int | None = None) -> int:
        """Copy a state dict, a *.safetensors file or a directory of them into the model; bump the version."""
        state = load_state(source)
        params = check_state(self.model, state)
        with self._model_lock:
            copy_state(params, state)
            self._version = next_version(self._version, version)
            return self._version

    # ------------------------------------------------------------------ decoding

    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]) -> list[Generation]:
        """Decode prompts together (chunks of at most max_batch_size). Blocking; safe to call from a thread."""
        if self._closed:
            raise RuntimeError("engine is closed")
        if len(prompts) != len(samplings):
            raise ValueError(f"got {len(prompts)} prompts but {len(samplings)} sampling params")
        vocab = self._vocab_size
        for prompt, sampling in zip(prompts, samplings, strict=True):
            check_request(prompt, sampling, vocab)
        results: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = slice(start, start + self.max_batch_size)
            with self._model_lock, torch.inference_mode():
                self.num_batches += 1
                results.extend(self._decode_loop(list(prompts[chunk]), list(samplings[chunk])))
        return results

    def _new_rows(self, samplings: list[SamplingParams]) -> _Rows:
        n, dev = len(samplings), self.device
        return _Rows(
            sampling=samplings,
            stop_ids=[self.eos_token_ids | frozenset(s.stop_token_ids) for s in samplings],
            generators=[None if s.seed is None else torch.Generator(device=dev).manual_seed(s.seed) for s in samplings],
            temperature=torch.tensor([s.temperature for s in samplings], dtype=torch.float32, device=dev),
            top_k=torch.tensor([s.top_k for s in samplings], dtype=torch.long, device=dev),
            top_p=torch.tensor([s.top_p for s in samplings], dtype=torch.float32, device=dev),
            min_p=torch.tensor([s.min_p for s in samplings], dtype=torch.float32, device=dev),
            token_ids=[[] for _ in range(n)],
            logprobs=[[] for _ in range(n)],
            versions=[[] for _ in range(n)],
            stop_reason=[None] * n,
        )

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """One model call; returns float32 logits of the last position [B, V]."""
        self.num_forwards += 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _decode_loop(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        """Static batch: left-padded prefill, then one forward per step until every row is done."""
        n, dev = len(prompts), self.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=dev)
        attention_mask = torch.zeros((n, width), dtype=torch.long, device=dev)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long, device=dev)
            attention_mask[i, width - len(prompt) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache(config=self.model.config)
        rows = self._new_rows(samplings)
        done = torch.zeros(n, dtype=torch.bool, device=dev)

        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        next_pos = position_ids[:, -1:] + 1
        for _ in range(max(s.max_tokens for s in samplings)):
            if self._abort.is_set():
                self._finish_aborted(rows)
                break
            ids, logp = self._pick(logits, rows)
            self._record(rows, ids.tolist(), logp.tolist(), done)
            if bool(done.all()):
                break
            # Finished rows keep being fed pad tokens; their outputs are ignored.
            feed = ids.masked_fill(done, self.pad_token_id).unsqueeze(-1)
            attention_mask = torch.cat([attention_mask, torch.ones((n, 1), dtype=torch.long, device=dev)], dim=-1)
            logits = self._forward(feed, attention_mask, next_pos, cache)
            next_pos = next_pos + 1
        return [self._to_generation(rows, i) for i in range(n)]

    def _pick(self, logits: torch.Tensor, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the next token per row and its logprob under the unfiltered (temperature-scaled) distribution."""
        filtered = process_logits(logits, rows.temperature, rows.top_k, rows.top_p, rows.min_p)
        ids = sample(filtered, self._generator, rows.generators)
        return ids, token_logprobs(logits, ids, rows.temperature)

    def _record(self, rows: _Rows, ids: list[int], logp: list[float], done: torch.Tensor) -> None:
        """Append this step's token to every unfinished row; mark rows that hit a stop token or max_tokens."""
        version = self._version
        for i, (tok, lp) in enumerate(zip(ids, logp, strict=True)):
            if rows.stop_reason[i] is not None:
                continue
            rows.token_ids[i].append(tok)
            rows.logprobs[i].append(lp)
            rows.versions[i].append(version)
            if tok in rows.stop_ids[i]:
                rows.stop_reason[i] = "stop"
            elif len(rows.token_ids[i]) >= rows.sampling[i].max_tokens:
                rows.stop_reason[i] = "length"
            if rows.stop_reason[i] is not None:
                done[i] = True

    def _finish_aborted(self, rows: _Rows) -> None:
        for i, reason in enumerate(rows.stop_reason):
            if reason is None:
                rows.stop_reason[i] = "abort"

    def _to_generation(self, rows: _Rows, i: int) -> Generation:
        versions = rows.versions[i]
        reason = rows.stop_reason[i]
        assert reason is not None, "decode loop ended with an unfinished row"
        return Generation(
            token_ids=rows.token_ids[i],
            logprobs=rows.logprobs[i],
            stop_reason=reason,
            weight_version=versions[-1] if versions else self._version,
            weight_versions=versions,
        )

"""`EmbeddedEngine`: the embedded engine's public API; the package docstring tells how it works.

The facade checks and queues requests (request_queue.py), builds the parts the scheduler thread runs (loop.py:
admission, placement and eviction in scheduler.py, prefill planning in prefill.py, the decode step in decode.py,
sampling records in records.py) and takes the same model lock for weight updates, between two iterations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import torch
from transformers import PreTrainedModel

from thermik.cpu.openmp import release_thread_pool, to_thread_releasing
from thermik.inference.base import (
    Generation,
    SamplingParams,
    StreamItem,
    TokenDelta,
    WeightSource,
    check_request,
    next_version,
)
from thermik.inference.embedded.decode import Decoder, make_decode_graphs
from thermik.inference.embedded.loop import SchedulerLoop
from thermik.inference.embedded.prefill import PrefillPlanner
from thermik.inference.embedded.records import SampleRecorder
from thermik.inference.embedded.request_queue import RequestQueue
from thermik.inference.embedded.requests import Counters, Detokenize, Request
from thermik.inference.embedded.scheduler import INITIAL_CACHE_LEN, SlotScheduler
from thermik.inference.kv_cache import default_budget_bytes
from thermik.inference.native_model import NativeCausalLM
from thermik.inference.weights import check_state, copy_state, load_state

INFLIGHT_KV = ("keep", "recompute")
Item = tuple[Sequence[int], SamplingParams, str | None]  # (prompt ids, sampling, session id) of one request


class EmbeddedEngine:
    """InferenceEngine for Qwen2/Qwen3/Llama-shaped HF models living in this process; see the package docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 0,
        detokenize: Detokenize | None = None,
        gather_window_s: float = 0.02,
        reuse_prefixes: bool = True,
        num_threads: int = 0,
        kv_cache_gb: float | None = None,
        weight_formats: tuple[str, ...] = ("blas",),
        decode_graphs: str = "auto",
        inflight_kv: str = "keep",
    ) -> None:
        """`kv_cache_gb`: the KV cache's budget in GiB (2^30 bytes); None takes a quarter of the available RAM (on
        CUDA, of the free GPU memory; `kv_cache.default_budget_bytes` says why), `math.inf` sets no budget.
        `weight_formats`: the projections' weight formats to choose from (`NativeCausalLM`; cpu/engine_precision.py's
        `projection_formats` for a precision name). `decode_graphs`: "auto" replays the decode step as CUDA graphs on a
        GPU and keeps the native forward on a CPU; "capture", "eager" (the same fixed-shape step, not captured) or
        "off" (the native forward) force one (decode_graphs.py). `inflight_kv`: what a weight update does to the KV
        cache of the requests running through it: "keep" their keys and values (computed by the old weights, as
        PipelineRL does; free) or "recompute" them under the new weights (one prefill of every running sequence)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if inflight_kv not in INFLIGHT_KV:
            raise ValueError(f"inflight_kv must be one of {INFLIGHT_KV}, got {inflight_kv!r}")
        if kv_cache_gb is not None and not kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {kv_cache_gb}")
        self.model = model.eval()
        self.native = NativeCausalLM(model, weight_formats)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.detokenize = detokenize
        self.num_threads = num_threads
        self.inflight_kv = inflight_kv
        self.device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.graphs = make_decode_graphs(self.native, decode_graphs, self.device)
        if kv_cache_gb is None:
            budget = default_budget_bytes(self.device)
        else:
            budget = None if math.isinf(kv_cache_gb) else int(kv_cache_gb * 2**30)
        cache = self.native.new_cache(num_slots=8, max_len=INITIAL_CACHE_LEN, budget_bytes=budget)
        self.counters = Counters()
        self.queue = RequestQueue(max_batch_size, gather_window_s)
        self.scheduler = SlotScheduler(cache, max_batch_size, self.native.max_positions, self.graphs is not None)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.records = SampleRecorder(generator, detokenize, self.native.max_positions)
        self.prefill = PrefillPlanner(
            self.native, self.scheduler, self.records, self.counters, self.pad_token_id, reuse_prefixes
        )
        self.decoder = Decoder(self.native, self.graphs, self.scheduler, self.records, self.counters)
        self._model_lock = threading.Lock()  # held for each scheduler iteration and each weight update
        self.loop = SchedulerLoop(self.queue, self.scheduler, self.prefill, self.decoder, self._model_lock, num_threads)

    @property
    def weight_version(self) -> int:
        return self.records.version

    @property
    def num_batches(self) -> int:
        """Admission rounds that ran a prefill."""
        return self.counters.batches

    @property
    def num_forwards(self) -> int:
        return self.counters.forwards

    @property
    def num_prefill_tokens(self) -> int:
        return self.counters.prefill_tokens

    # ------------------------------------------------------------------ public API

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        """Queue one request. `session_id` keeps its cache slot for the session's next turn (multi-turn episodes)."""
        future = self._submit([(prompt_ids, sampling, session_id)])[0]
        release_thread_pool()  # this thread waits now: its OpenMP workers would slow the scheduler's (openmp.py)
        return await asyncio.wrap_future(future)

    def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> AsyncIterator[StreamItem]:
        """Queue one request now (bad input raises here, before anything is streamed) and return an iterator of
        `TokenDelta`s as tokens are sampled, then the finished `Generation`. Closing the iterator early cancels
        the request."""
        loop = asyncio.get_running_loop()
        wake: asyncio.Queue[None] = asyncio.Queue()

        def notify() -> None:  # runs on the scheduler thread: it must not raise there
            with contextlib.suppress(RuntimeError):  # the consumer's loop is closed; its request is being cancelled
                loop.call_soon_threadsafe(wake.put_nowait, None)

        req = self._enqueue([(prompt_ids, sampling, session_id)], on_token=notify)[0]
        req.future.add_done_callback(lambda _: notify())
        release_thread_pool()
        return _drain(req, wake)

    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]) -> list[Generation]:
        """Blocking: queue all prompts at once and wait for every result (safe to call from any thread)."""
        if len(prompts) != len(samplings):
            raise ValueError(f"got {len(prompts)} prompts but {len(samplings)} sampling params")
        futures = self._submit([(p, s, None) for p, s in zip(prompts, samplings, strict=True)])
        release_thread_pool()
        return [f.result() for f in futures]

    def end_session(self, session_id: str) -> None:
        """The episode is over: its slot becomes free for new requests (its cached tokens stay reusable as a
        prefix). Without this, parked sessions hold their slots until evicted, and running rows spread over many
        slots (slower, sparse decode steps)."""
        self.queue.end_session(session_id)

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Copy new weights in place between two decode steps; running requests go on under them (each token records
        the version that sampled it), their KV cache kept or recomputed (`inflight_kv`). Returns the new version
        (`version` when given)."""
        return await to_thread_releasing(self.update_weights_sync, source, version)

    def update_weights_sync(self, source: WeightSource, version: int | None = None) -> int:
        state = load_state(source)
        params = check_state(self.model, state)
        with self._model_lock:
            copy_state(params, state)
            self.native.refresh()
            self.scheduler.forget_idle()  # cached prefixes of finished requests were computed by the old weights
            if self.inflight_kv == "recompute":
                with torch.inference_mode():
                    self.prefill.recompute()
            self.records.version = next_version(self.records.version, version)
            return self.records.version

    def release_idle_cache(self) -> None:
        """Drop the idle slots (finished requests' prefixes, parked sessions) and shrink the KV cache to the running
        requests' slots, giving its memory back to the process. A synchronous run calls it when a step's sampling
        ends (runs/step.py): the next weight update would drop those prefixes anyway, and the trainer's memory peak
        then does not add to the cache's. The next admission regrows the cache in one reallocation."""
        with self._model_lock:
            self.scheduler.drop_idle()

    def require_room(self, positions: int, key: str = "rollout.max_sequence_length") -> None:
        """Fail at start, before any work, when the KV cache budget cannot hold one sequence of `positions` (`key`
        names the setting they come from)."""
        self.scheduler.require_room(positions, key)

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[tuple[float, int]]:
        """(logprob, rank) of each token after the first given the tokens before it, at temperature 1 (rank 1 is the
        most likely token): one forward of the model between two scheduler iterations, never during a weight update.
        What a teacher returns in on-policy distillation (`/v1/completions` `prompt_logprobs`)."""
        return await asyncio.to_thread(self._prompt_logprobs, list(token_ids))

    def _prompt_logprobs(self, ids: list[int]) -> list[tuple[float, int]]:
        if len(ids) > self.native.max_positions:
            raise ValueError(f"{len(ids)} tokens exceed the model's context of {self.native.max_positions}")
        tokens = torch.tensor([ids], device=self.device)
        with self._model_lock, torch.inference_mode():
            logits = self.model(input_ids=tokens, use_cache=False).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(1, tokens[0, 1:, None])
        ranks = (logp > chosen).sum(dim=-1) + 1
        return list(zip(chosen[:, 0].tolist(), ranks.tolist(), strict=True))

    async def close(self) -> None:
        """Stop serving: running and queued requests end with stop_reason "abort"; new ones are refused."""
        await asyncio.to_thread(self.queue.stop)
        self.loop.abort_all()

    # ------------------------------------------------------------------ requests

    def _submit(self, items: list[Item]) -> list[concurrent.futures.Future]:
        return [r.future for r in self._enqueue(items)]

    def _enqueue(self, items: list[Item], on_token: Callable[[], None] | None = None) -> list[Request]:
        for prompt_ids, sampling, _ in items:
            check_request(prompt_ids, sampling, self._vocab_size)
            if sampling.stop and self.detokenize is None:
                raise ValueError("sampling.stop (stop strings) needs an engine built with detokenize=...")
            self.scheduler.check_fits(len(prompt_ids), sampling.max_tokens)
        requests = [
            Request(
                prompt_ids=list(prompt_ids),
                sampling=sampling,
                session_id=session_id,
                future=concurrent.futures.Future(),
                stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
                generator=None if sampling.seed is None else torch.Generator(self.device).manual_seed(sampling.seed),
                on_token=on_token,
            )
            for prompt_ids, sampling, session_id in items
        ]
        self.queue.put(requests, self.loop.serve)
        return requests


async def _drain(req: Request, wake: asyncio.Queue[None]) -> AsyncIterator[StreamItem]:
    """`req`'s tokens as `TokenDelta`s, each time the scheduler thread wakes us, then its `Generation`."""
    future, sent = req.future, 0
    try:
        while True:
            await wake.get()
            done = future.done()
            count = len(req.logprobs)  # appended after the token id: the lists agree up to here
            if count > sent:
                tops = req.top_logprobs[sent:count] if req.sampling.top_logprobs else None
                yield TokenDelta(req.token_ids[sent:count], req.logprobs[sent:count], tops)
                sent = count
            if done:
                yield future.result()
                return
    finally:
        future.cancel()  # a consumer that stops early frees the slot (no-op once finished)

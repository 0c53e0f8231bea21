"""The remote backend against a real `thermik inference` server on loopback: same tokens and logprobs as the
embedded engine, weight updates through safetensors, errors, and RL steps with `--inference.backend remote`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file
from serving import embedded_engine, running, start_thermik_inference

from thermik.cli import main
from thermik.inference.base import Generation, SamplingParams
from thermik.inference.remote import RemoteEngine, generation_from_choice
from thermik.inference.server.app import build_app
from thermik.models.loading import load_model
from thermik.models.presets import init_model

MODEL = "tiny"
http = httpx.Client(timeout=120)  # generous: the 2 shared cores can be heavily loaded


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[tuple[str, Any]]:
    engine, tokenizer = embedded_engine(tiny_model_dir)
    with running(build_app(engine, tokenizer, MODEL, api_key="k3y"), on_exit=engine.close) as url:
        yield url, tokenizer


def _remote(url: str, tmp_path: Path | None = None, **kw: Any) -> RemoteEngine:
    return RemoteEngine(url, api_key="k3y", weights_dir=tmp_path, stop_token_ids=(), **kw)


def _generate_all(engine: Any, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
    async def run() -> list[Generation]:
        try:
            return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        finally:
            await engine.close()

    return asyncio.run(run())


def test_remote_gives_the_embedded_engines_tokens_and_logprobs(server: tuple[str, Any], tiny_model_dir: Path) -> None:
    url, tokenizer = server
    texts = ["2+2=", "reverse: abc", "x"]
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts] * 2
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=100 + i) for i in range(3)]
    params += [SamplingParams(max_tokens=12, temperature=0.0, top_k=5, seed=7)] * 3
    remote = _generate_all(_remote(url), prompts, params)
    local_engine, _ = embedded_engine(tiny_model_dir)
    local = _generate_all(local_engine, prompts, params)
    for r, e in zip(remote, local, strict=True):
        assert r.token_ids == e.token_ids
        assert r.logprobs == pytest.approx(e.logprobs, abs=1e-5)
        assert r.stop_reason == e.stop_reason and r.weight_versions == [r.weight_version] * len(r.token_ids)


def test_update_weights_pushes_a_state_dict_through_safetensors(
    server: tuple[str, Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    url, tokenizer = server
    prompt = tokenizer.encode("7*8=", add_special_tokens=False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    other = load_model(init_model("qwen2-1m", tmp_path / "other", seed=1))
    engine = _remote(url, tmp_path / "weights")

    async def run() -> tuple[Generation, int, Generation, int, Generation]:
        before = await engine.generate(prompt, greedy)
        v1 = await engine.update_weights(other.state_dict())
        changed = await engine.generate(prompt, greedy)
        v2 = await engine.update_weights(tiny_model_dir)  # a directory is sent as is
        back = await engine.generate(prompt, greedy)
        return before, v1, changed, v2, back

    before, v1, changed, v2, back = asyncio.run(run())
    assert (
        v2
        == v1 + 1
        == http.get(url + "/weight_version", headers={"Authorization": "Bearer k3y"}).json()["weight_version"]
    )
    assert changed.weight_version == v1 and back.weight_version == v2
    assert changed.logprobs != before.logprobs
    assert back.token_ids == before.token_ids and back.logprobs == pytest.approx(before.logprobs, abs=1e-6)
    (saved,) = (tmp_path / "weights").glob("v*/model.safetensors")
    tensors = load_file(str(saved))
    assert set(tensors) < set(other.state_dict())  # the tied lm_head is stored once, under the embedding's name
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors


def test_a_resumed_push_sets_the_servers_weight_version_and_counting_goes_on_from_it(
    server: tuple[str, Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    url, tokenizer = server
    prompt = tokenizer.encode("7*8=", add_special_tokens=False)
    engine = _remote(url, tmp_path / "weights")

    async def run() -> tuple[int, Generation, int]:
        resumed = await engine.update_weights(tiny_model_dir, version=40)  # a run resumed from step 40
        generation = await engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0.0))
        return resumed, generation, await engine.update_weights(tiny_model_dir)

    resumed, generation, following = asyncio.run(run())
    assert (resumed, generation.weight_version, following) == (40, 40, 41)
    assert http.get(url + "/weight_version", headers={"Authorization": "Bearer k3y"}).json()["weight_version"] == 41


def test_refused_requests_raise_value_error_and_a_dead_server_connection_error(server: tuple[str, Any]) -> None:
    url, _ = server
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _generate_all(_remote(url), [[5000]], [SamplingParams(max_tokens=2)])
    with pytest.raises(ValueError, match="API key"):
        _generate_all(RemoteEngine(url, api_key="wrong"), [[1]], [SamplingParams(max_tokens=2)])
    with pytest.raises(ConnectionError, match="cannot reach"):
        _generate_all(_remote("http://127.0.0.1:9", model=MODEL), [[1]], [SamplingParams(max_tokens=2)])


def test_a_connection_closed_by_the_server_is_retried_on_a_fresh_one() -> None:
    """The keep-alive race: the server drops a connection as a request goes out on it (here: the first two)."""
    choice = {"index": 0, "text": "", "finish_reason": "length", "token_ids": [5, 6],
              "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0]}}  # fmt: skip
    body = json.dumps({"choices": [choice]}).encode()
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        if connections > 2:
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        writer.close()

    async def main() -> Generation:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = RemoteEngine(f"http://127.0.0.1:{port}", model=MODEL)
        try:
            return await engine.generate([1, 2], SamplingParams(max_tokens=2))
        finally:
            await engine.close()
            server.close()

    gen = asyncio.run(main())
    assert gen.token_ids == [5, 6] and gen.logprobs == [-1.0, -2.0] and connections == 3


def test_vllm_style_choice_with_token_id_strings() -> None:
    """vLLM started with --return-tokens-as-token-ids (no return_token_ids support) names tokens 'token_id:N'."""
    choice = {
        "index": 0, "text": "hi", "finish_reason": "length",
        "logprobs": {"tokens": ["token_id:17", "token_id:4"], "token_logprobs": [-0.25, -1.5],
                     "top_logprobs": [{"token_id:17": -0.25, "token_id:3": -2.0}, {"token_id:4": -1.5}]},
    }  # fmt: skip
    gen = generation_from_choice(choice, fallback_version=3)
    assert gen.token_ids == [17, 4] and gen.logprobs == [-0.25, -1.5] and gen.stop_reason == "length"
    assert gen.top_logprobs == [{17: -0.25, 3: -2.0}, {4: -1.5}] and gen.weight_versions == [3, 3]


@pytest.mark.slow
def test_rl_steps_through_a_thermik_inference_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    server_args = ("--model.path", str(tiny_model_dir), "--server.port", "0")
    proc, url = start_thermik_inference(tmp_path / "server.log", *server_args)
    try:
        args = [
            "rl",
            "--name", "remote",
            "--output_dir", str(tmp_path / "runs"),
            "--model.path", str(tiny_model_dir),
            "--inference.backend", "remote",
            "--inference.base_url", url,
            "--inference.weights_dir", str(tmp_path / "weights"),
            "--env.name", "reverse_text",
            "--env.max_turns", "1",
            "--trainer.steps", "2",
            "--trainer.prompts_per_step", "2",
            "--trainer.group_size", "2",
            "--rollout.max_generate_length", "16",
            "--algorithm.entropy_coef", "0.01",
            "--data.synthetic_train_size", "16",
            "--data.synthetic_eval_size", "2",
            "--eval.before", "false",
            "--eval.size", "2",
            "--monitor.progress", "false",
            "--monitor.save_trajectories_every", "0",
        ]  # fmt: skip
        assert main(args) == 0
        metrics = [
            json.loads(line) for line in (tmp_path / "runs" / "remote" / "metrics.jsonl").read_text().splitlines()
        ]
        steps = [m for m in metrics if "weights/version" in m]
        assert [m["weights/version"] for m in steps] == [1.0, 2.0]
        # The server sampled with the trainer's weights: its logprobs agree with the trainer's own.
        assert all(m["mismatch/logprob_abs_diff"] < 1e-4 for m in steps), [
            m["mismatch/logprob_abs_diff"] for m in steps
        ]
        assert http.get(url + "/weight_version").json() == {"weight_version": 2}
        assert not list((tmp_path / "weights").glob("v000001")), "older pushed weights are removed"
    finally:
        proc.terminate()
        proc.wait(timeout=30)

"""In-flight weight updates: a request running through an update goes on under the new weights, every token records
the version that sampled it and its behaviour logprob, the KV cache is kept or recomputed (`inference.inflight_kv`),
and the learner's batch carries those per-token behaviour logprobs (tiny preset qwen2-1m)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from serving import running
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.conftest import short_rl_config
from thermik.config.model import InferenceConfig
from thermik.config.schema import ServeConfig
from thermik.envs.registry import register, unregister
from thermik.inference.base import Generation, SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.remote import RemoteEngine
from thermik.inference.server.app import build_app
from thermik.inference.server.run import serve_engine
from thermik.models.loading import load_tokenizer
from thermik.rollout.trajectory import Trajectory
from thermik.runs.local import run_rl
from thermik.training.batch import collate

PROMPT = [5, 17, 42, 99, 3, 250, 7]
# Long enough that the update lands mid-generation even on a loaded machine (as in test_engine_scheduling.py).
PARAMS = SamplingParams(max_tokens=1000, temperature=1.0, seed=0)


def load(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()


def perturbed(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The next version's weights: every tensor moved by noise (enough that stale keys/values show)."""
    gen = torch.Generator().manual_seed(1)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def generate_across_update(engine: EmbeddedEngine, new_state: dict[str, torch.Tensor]) -> Generation:
    async def main() -> Generation:
        task = asyncio.create_task(engine.generate(PROMPT, PARAMS))
        while engine.num_forwards < 5:
            await asyncio.sleep(0.001)
        await engine.update_weights(new_state)
        return await task

    gen = asyncio.run(main())
    assert gen.weight_versions == sorted(gen.weight_versions)
    assert gen.weight_versions[0] == 0 and gen.weight_versions[-1] == 1, "the update did not land mid-generation"
    return gen


def recomputed(model: PreTrainedModel, gen: Generation) -> torch.Tensor:
    """The logprob of each generated token from one full forward of `model` over prompt + generation (T = 1),
    computed as the learner computes them: through a collated batch."""
    batch = collate([trajectory(gen)], None, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits[0, :-1].float()
    logp = logits.log_softmax(-1).gather(1, batch.input_ids[0, 1:, None])[:, 0]
    return logp[batch.mask[0].bool()]


def trajectory(gen: Generation) -> Trajectory:
    n = len(gen.token_ids)
    return Trajectory(PROMPT, list(gen.token_ids), [1] * n, list(gen.logprobs), list(gen.weight_versions), [0.0] * n)


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path) -> tuple[PreTrainedModel, PreTrainedModel, dict[str, torch.Tensor]]:
    """(version 0, version 1, version 1's state)."""
    v0, v1 = load(tiny_model_dir), load(tiny_model_dir)
    state = perturbed(v0)
    v1.load_state_dict(state)
    return v0, v1, state


def run(tiny_model_dir: Path, state: dict[str, torch.Tensor], inflight_kv: str, graphs: str = "off") -> Generation:
    engine = EmbeddedEngine(
        load(tiny_model_dir), eos_token_ids=(), pad_token_id=0, inflight_kv=inflight_kv, decode_graphs=graphs
    )
    return generate_across_update(engine, state)


# eager: the fixed-shape step a GPU replays as a CUDA graph (slow on a CPU)
@pytest.mark.parametrize("graphs", ["off", pytest.param("eager", marks=pytest.mark.slow)])
def test_recompute_samples_each_token_under_its_versions_weights(tiny_model_dir: Path, models, graphs: str) -> None:
    """With the KV cache recomputed at the update, each token's recorded behaviour logprob is its version's exact
    logprob, and the learner's batch carries exactly those, token by token."""
    v0, v1, state = models
    gen = run(tiny_model_dir, state, "recompute", graphs)
    versions = torch.tensor(gen.weight_versions)
    expected = torch.where(versions == 0, recomputed(v0, gen), recomputed(v1, gen))
    torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0)
    batch = collate([trajectory(gen)], None, pad_id=0)
    torch.testing.assert_close(batch.rollout_logp[0][batch.mask[0].bool()], expected, atol=1e-4, rtol=0)


def test_keep_goes_on_with_stale_keys_and_values(tiny_model_dir: Path, models) -> None:
    """The default keeps the running request's cache: tokens before the update are version 0's exactly; later ones
    were sampled by version 1 reading version 0's keys/values, so they are not version 1's full-forward logprobs,
    and the recorded (behaviour) logprob is what the learner corrects with."""
    v0, v1, state = models
    assert InferenceConfig().inflight_kv == "keep"
    gen = run(tiny_model_dir, state, "keep")
    versions = torch.tensor(gen.weight_versions)
    logprobs = torch.tensor(gen.logprobs)
    old = versions == 0
    torch.testing.assert_close(logprobs[old], recomputed(v0, gen)[old], atol=1e-4, rtol=0)
    assert (logprobs[~old] - recomputed(v1, gen)[~old]).abs().max() > 1e-3


def test_inflight_kv_is_checked() -> None:
    with pytest.raises(ValueError, match="inflight_kv"):
        EmbeddedEngine(torch.nn.Linear(1, 1), eos_token_ids=(), pad_token_id=0, inflight_kv="drop")  # type: ignore[arg-type]


def test_async_local_run_with_recomputed_kv(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A one-step-off local run whose engine recomputes running requests' caches at each update: it trains, and
    every step logs the per-token staleness (within the bound) and what the staleness rule dropped."""
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "inflight", "lowercase", train_rows=16, eval_rows=4,
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 4, "max_async_steps": 1},
        inference={"inflight_kv": "recompute"}, rollout={"max_generate_length": 32},
    )  # fmt: skip
    register("lowercase", "tests.test_grpo_learns:CountLetterEnv")
    try:
        run_rl(cfg)
    finally:
        unregister("lowercase")
    lines = [json.loads(x) for x in (tmp_path / "inflight" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "off_policy/token_staleness_max" in x]
    assert len(steps) == 3
    assert all(x["off_policy/token_staleness_max"] <= 1 and x["async/dropped_tokens"] >= 0 for x in steps)


def test_thermik_inference_server_engine_takes_the_setting(tiny_model_dir: Path) -> None:
    """`thermik inference` builds its engine with inference.inflight_kv: a run's remote engine (the thermik server)
    updates in flight the same way."""
    cfg = ServeConfig.model_validate(
        {"model": {"path": str(tiny_model_dir)}, "inference": {"inflight_kv": "recompute", "precision": "float32"}}
    )
    engine, _ = serve_engine(cfg)
    assert engine.inflight_kv == "recompute"


def test_remote_engine_reads_per_token_versions_of_an_update_in_flight(tiny_model_dir: Path, models) -> None:
    """thermik's server on loopback, a weight update pushed through `RemoteEngine` while a request runs: the
    request's tokens come back with the version of each (0 then 1), so the run bounds staleness by the oldest."""
    _, _, state = models
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = EmbeddedEngine(load(tiny_model_dir), eos_token_ids=(), pad_token_id=0)

    async def main(url: str) -> Generation:
        remote = RemoteEngine(url, stop_token_ids=())
        try:
            task = asyncio.create_task(remote.generate(PROMPT, PARAMS))
            while engine.num_forwards < 5:
                await asyncio.sleep(0.001)
            await remote.update_weights(state)
            return await task
        finally:
            await remote.close()

    with running(build_app(engine, tokenizer, "tiny"), on_exit=engine.close) as url:
        gen = asyncio.run(main(url))
    assert gen.weight_versions == sorted(gen.weight_versions) and len(gen.weight_versions) == len(gen.token_ids)
    assert gen.weight_versions[0] == 0 and gen.weight_versions[-1] == gen.weight_version == 1

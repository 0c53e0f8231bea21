"""In-flight weight updates across processes and tools: the split orchestrator has thermik's server load the weights
the trainer publishes in shared memory while a request runs (woken by the trainer's doorbell, not by polling), and
multi-turn episodes whose MCP tool sleeps go on through weight updates (tiny preset qwen2-1m)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from serving import running
from test_inflight_updates import PARAMS, PROMPT, load, perturbed, recomputed, trajectory

from tests.conftest import short_rl_config
from thermik.envs.base import Env, StepOutput
from thermik.envs.registry import register, unregister
from thermik.envs.tool_use import tool_observation
from thermik.inference.base import Generation
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.server.app import build_app
from thermik.inference.shared_weights import is_shared, read_shared, shared_segment, unlink_segment, write_shared
from thermik.models.loading import load_tokenizer
from thermik.runs.local import run_rl
from thermik.runs.split.orchestrator import follow_weights, setup_orchestrator
from thermik.runs.split.trainer import publish_state
from thermik.tasks.calculator.server import TOOL_NAME, server_spec
from thermik.tools.mcp_pool import MCPPool
from thermik.training.batch import collate

TOOL_LATENCY_S = 0.25


def test_split_orchestrator_loads_shared_memory_weights_into_a_running_request(tmp_path: Path, tiny_model_dir: Path):
    """The trainer publishes step 1 in shared memory and rings; the orchestrator's follower has the server load it
    between two decode steps of a running request, long before its next look (poll_interval_s 30). The request's
    tokens carry version 0 then 1 (server versions are trainer steps), each logprob is its version's recomputed
    logprob (inflight_kv = recompute), and the batch the trainer gets carries exactly those."""
    v0, v1 = load(tiny_model_dir), load(tiny_model_dir)
    state = perturbed(v0)
    v1.load_state_dict(state)
    engine = EmbeddedEngine(load(tiny_model_dir), eos_token_ids=(), pad_token_id=0, inflight_kv="recompute")
    # From the trainer's ring until the server has the weights, each model call takes 20 ms more: the request's
    # remaining ~1000 tokens then outlast the 15 s the load may take, however loaded the machine is.
    pacing, model_call = threading.Event(), engine.native.forward

    def paced_call(*args: object, **kwargs: object) -> torch.Tensor:
        if pacing.is_set():
            time.sleep(0.02)
        return model_call(*args, **kwargs)

    engine.native.forward = paced_call
    app = build_app(engine, load_tokenizer(tiny_model_dir), "tiny", max_model_len=2048)
    with running(app, on_exit=engine.close) as url:
        cfg = short_rl_config(
            tmp_path, tiny_model_dir, "split-inflight", "reverse_text", inference={"base_url": url},
            trainer={"max_async_steps": 1, "steps": 1}, split={"wait_timeout_s": 60, "poll_interval_s": 30},
        )  # fmt: skip

        async def scenario() -> tuple[Generation, float, dict[int, int], bool]:
            orch = await setup_orchestrator(cfg)
            follower = asyncio.create_task(follow_weights(orch))
            try:
                request = asyncio.create_task(orch.engine.generate(PROMPT, PARAMS))
                while engine.num_forwards < 5:
                    await asyncio.sleep(0.001)
                t0 = time.perf_counter()
                pacing.set()
                publish_state(state, orch.layout, 1, cfg)  # what the trainer does after its first update
                shared = is_shared(orch.layout.weights_dir(1))
                while orch.weight_step < 1:
                    await asyncio.sleep(0.005)
                loaded_after = time.perf_counter() - t0
                pacing.clear()
                return await request, loaded_after, dict(orch.step_of_version), shared
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
                await orch.stop()  # loads the final weights (of trainer.steps = 1) and frees their shared memory
                await orch.run.close()

        gen, loaded_after, versions, shared = asyncio.run(scenario())
    assert shared and versions == {0: 0, 1: 1}
    assert loaded_after < 15, "the follower waited for its next look instead of the trainer's ring"
    assert gen.weight_versions == sorted(gen.weight_versions)
    assert gen.weight_versions[0] == 0 and gen.weight_versions[-1] == 1, "the update did not land mid-generation"
    versions_t = torch.tensor(gen.weight_versions)
    expected = torch.where(versions_t == 0, recomputed(v0, gen), recomputed(v1, gen))
    torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0)
    batch = collate([trajectory(gen)], None, pad_id=0)
    torch.testing.assert_close(batch.rollout_logp[0][batch.mask[0].bool()], expected, atol=1e-4, rtol=0)
    segment = shared_segment(cfg.run_dir / "weights" / "step_1")
    assert segment is not None and not segment.exists()  # freed when the orchestrator stopped


class SlowToolEnv(Env):
    """Three turns, each a call of the calculator MCP server's tool, which sleeps TOOL_LATENCY_S, whatever the model
    wrote (a tiny untrained model writes no tool calls); reward: the share of letters in the last answer."""

    uses_mcp_pool = True

    def __init__(self, *, reward_spec: dict, extra_info: dict, options: object, pool: MCPPool) -> None:
        self.spec, self.pool, self.turns = server_spec(TOOL_LATENCY_S), pool, 0

    async def astep(self, action: str) -> StepOutput:
        self.turns += 1
        if self.turns == 3:
            return StepOutput([], sum(c.isalpha() for c in action) / max(len(action), 1), True)
        args = {"expression": f"{self.turns} + {len(action)}"}
        result = await self.pool.call_tool(self.spec, TOOL_NAME, args, timeout_s=30)
        return StepOutput([tool_observation(TOOL_NAME, result)], 0.0, False, {"tool_calls": 1})

    def step(self, action: str) -> StepOutput:
        raise TypeError("SlowToolEnv calls an MCP server: use astep")


def ending_turns_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model, changed so that every turn ends after a token or two with the end-of-turn token (an untrained
    model would write until rollout.max_generate_length, which ends the episode): residual dimension 0 is a constant
    (every embedding's, no layer writes it) that, through the tied head, favours the eos token."""
    model = load(tiny_model_dir)
    eos = int(load_tokenizer(tiny_model_dir).eos_token_id)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.model.embed_tokens.weight[eos, 0] = 12.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
    model.save_pretrained(out)
    load_tokenizer(tiny_model_dir).save_pretrained(out)
    return out


def test_mcp_tool_episodes_go_on_through_weight_updates(tmp_path: Path, tiny_model_dir: Path) -> None:
    """One step off-policy, episodes of three turns with two real MCP tool calls of 0.25 s each: weight updates land
    while episodes wait on their tools; the episodes go on (nothing cancelled) under the newer weights, so samples
    span two versions, each token's version never decreases along the episode, and the learner trains them."""
    model_dir = ending_turns_model(tiny_model_dir, tmp_path / "model")
    cfg = short_rl_config(
        tmp_path, model_dir, "mcp-inflight", "slowtool", train_rows=32, eval_rows=2,
        trainer={"steps": 4, "prompts_per_step": 2, "group_size": 2, "max_async_steps": 1},
        rollout={"max_generate_length": 8, "max_input_length": 256, "max_sequence_length": 320},
        eval={"before": False}, monitor={"progress": False, "save_trajectories_every": 1},
    )  # fmt: skip
    cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"max_turns": 3})})
    register("slowtool", f"{__name__}:SlowToolEnv")
    try:
        run_rl(cfg)
    finally:
        unregister("slowtool")
    metrics = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "off_policy/versions_per_sample_max" in m]
    assert len(steps) == 4 and all(m["async/cancelled_groups_total"] == 0 for m in steps)
    assert max(m["off_policy/versions_per_sample_max"] for m in steps) >= 2, "no update landed mid-episode"
    assert all(m["policy/loss"] == m["policy/loss"] for m in metrics if "policy/loss" in m)
    episodes = [json.loads(x) for f in sorted((cfg.run_dir / "trajectories").glob("step_*.jsonl"))
                for x in f.read_text().splitlines()]  # fmt: skip
    spanning = []
    for episode in episodes:
        samples = [episode, *episode["continuations"]]
        versions = [v for s in samples for v in s["weight_versions"] if v >= 0]
        assert versions == sorted(versions)  # later turns, later (or the same) weights
        if len(set(versions)) > 1:
            spanning.append(episode["env_metrics"].get("tool_calls", 0))
    assert spanning and max(spanning) >= 1  # an episode went on under new weights after a tool call


@pytest.fixture(autouse=True)
def _no_leftover_segments():
    before = set(Path("/dev/shm").glob("thermik-split-inflight-*"))
    yield
    assert not set(Path("/dev/shm").glob("thermik-split-inflight-*")) - before


def test_a_reused_shared_memory_slot_is_refused_for_the_step_it_no_longer_holds(tmp_path: Path) -> None:
    """Slots are reused in place (same segment, no new file): a directory whose segment now holds a newer step is
    refused instead of loading the wrong weights; the newer one reads back exactly."""
    older, newer = tmp_path / "step_1", tmp_path / "step_3"
    older.mkdir(), newer.mkdir()
    a = {"w": torch.randn(3, 5), "b": torch.arange(4, dtype=torch.int64), "h": torch.randn(7).bfloat16()}
    b = {k: v + 1 for k, v in a.items()}
    segment = write_shared(a, older, "thermik-split-inflight-probe-slot1", 1)
    try:
        assert all(torch.equal(read_shared(older)[k], v) for k, v in a.items())
        inode = segment.stat().st_ino
        assert write_shared(b, newer, "thermik-split-inflight-probe-slot1", 3) == segment
        assert segment.stat().st_ino == inode  # written into the mapped pages, not a new file
        assert all(torch.equal(read_shared(newer)[k], v) for k, v in b.items())
        with pytest.raises(ValueError, match="hold step 3, not the step 1"):
            read_shared(older)
    finally:
        unlink_segment(newer)
    assert not segment.exists()

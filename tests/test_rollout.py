"""Agent-loop invariants on multi-turn trajectories (DESIGN.md invariants 1-3).

A scripted engine replays chosen assistant texts so the loop can be driven into a malformed tool
call, a truncated turn and an overlong sequence on demand; the calculator tool is the real MCP server.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from thermik.config.schema import EnvConfig, RolloutConfig, SamplingConfig
from thermik.inference.base import Generation, SamplingParams
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits, PromptTooLongError, rollout_rows, run_episode
from thermik.rollout.invariants import TrajectoryInvariantError, check_trajectory
from thermik.tasks.registry import generate_rows, make_env, solve
from thermik.tools.mcp_pool import MCPPool


class ScriptedEngine:
    """Replays fixed assistant texts as token ids; records every prompt it was given."""

    def __init__(self, chat: ChatTokenizer, texts: list[str]) -> None:
        self.chat, self.texts, self.prompts = chat, list(texts), []
        self.weight_version = 3

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None):
        self.prompts.append(list(prompt_ids))
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_id]
        stop = "stop"
        if len(ids) > sampling.max_tokens:
            ids, stop = ids[: sampling.max_tokens], "length"
        logps = [-0.25 - 0.01 * i for i in range(len(ids))]
        return Generation(ids, logps, stop, self.weight_version, [self.weight_version] * len(ids))


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    return ChatTokenizer(build_tokenizer())


@pytest.fixture(scope="module")
def row() -> dict:
    return generate_rows("calculator", 1, seed=3, split="eval")[0]


def calc_env(row: dict, pool: MCPPool):
    return make_env(
        "calculator",
        reward_spec=row["reward_spec"],
        extra_info=row.get("extra_info", {}),
        options=EnvConfig(name="calculator", tool_timeout_s=10),
        pool=pool,
    )


def limits(max_turns: int = 4, gen: int = 96, seq: int = 1024) -> LoopLimits:
    return LoopLimits(max_turns=max_turns, max_input_length=512, max_generate_length=gen, max_sequence_length=seq)


def play(chat: ChatTokenizer, row: dict, texts: list[str], lim: LoopLimits):
    engine = ScriptedEngine(chat, texts)

    async def go():
        pool = MCPPool()
        try:
            return await run_episode(engine, calc_env(row, pool), chat, row["prompt"], lim, SamplingConfig())
        finally:
            await pool.aclose()

    return asyncio.run(go()), engine


def solved_texts(row: dict) -> list[str]:
    return [m["content"] for m in solve(row) if m["role"] == "assistant"]


def test_solved_episode_is_exact_prefix_and_masked(chat: ChatTokenizer, row: dict) -> None:
    texts = solved_texts(row)
    traj, engine = play(chat, row, texts, limits())
    assert traj.stop_reason == "stop" and traj.num_turns == 2 and traj.reward == 1.0
    full = traj.prompt_ids + traj.response_ids
    # Each turn's engine input is a prefix of the final sequence, and the final sequence extends it
    # by exactly the sampled ids: nothing was re-tokenized.
    for prompt in engine.prompts:
        assert full[: len(prompt)] == prompt
    first_sampled = [*chat.encode(texts[0]), chat.eos_id]
    assert engine.prompts[1][len(traj.prompt_ids) : len(traj.prompt_ids) + len(first_sampled)] == first_sampled
    # Loss mask: 1 exactly on the two sampled turns.
    s0, e0, o0 = traj.turn_spans[0]
    s1, e1, _ = traj.turn_spans[1]
    assert traj.loss_mask == [1] * (e0 - s0) + [0] * (o0 - e0) + [1] * (e1 - s1)
    assert sum(traj.loss_mask) == len(first_sampled) + len(chat.encode(texts[1])) + 1
    # Observation holds the real MCP result; reward on the last sampled token only; versions on sampled tokens.
    obs_text = chat.tokenizer.decode(traj.response_ids[e0:o0])
    assert "<tool_response>" in obs_text and str(row["reward_spec"]["ground_truth"]) in obs_text
    assert traj.rewards[-1] == 1.0 and sum(traj.rewards) == 1.0
    assert {traj.weight_versions[i] for i in range(len(traj.loss_mask)) if traj.loss_mask[i]} == {3}
    assert traj.env_metrics["tool_calls"] == 1 and traj.env_metrics.get("tool_failures", 0) == 0


def test_sft_encoding_equals_rollout_sequence(chat: ChatTokenizer, row: dict) -> None:
    traj, _ = play(chat, row, solved_texts(row), limits())
    env = calc_env(row, MCPPool())  # only its tool schemas are read: no server starts
    ids, mask = chat.encode_conversation(solve(row), env.tools)
    assert ids == traj.prompt_ids + traj.response_ids
    assert mask == [0] * len(traj.prompt_ids) + traj.loss_mask


def test_malformed_tool_call_becomes_error_observation(chat: ChatTokenizer, row: dict) -> None:
    answer = row["reward_spec"]["ground_truth"]
    traj, _ = play(
        chat,
        row,
        ['<tool_call>\n{"name": "calculate", "arguments": {broken\n</tool_call>', f"<answer>{answer}</answer>"],
        limits(),
    )
    assert traj.num_turns == 2 and traj.stop_reason == "stop" and traj.reward == 1.0
    _, e, o = traj.turn_spans[0]
    assert o > e and "error" in chat.tokenizer.decode(traj.response_ids[e:o]).lower()
    assert traj.env_metrics["tool_failures"] >= 1


def test_truncated_turn_stops_with_length(chat: ChatTokenizer, row: dict) -> None:
    traj, engine = play(chat, row, ["1234567890" * 5], limits(gen=16))
    assert traj.stop_reason == "length" and traj.num_turns == 1 and len(engine.prompts) == 1
    assert traj.response_ids == chat.encode("1234567890" * 5)[:16]
    assert traj.loss_mask == [1] * 16  # a per-turn cut is trained (reward 0), only overlong sequences are masked
    assert traj.reward == 0.0


def test_overlong_sequence_is_masked(chat: ChatTokenizer, row: dict) -> None:
    env = calc_env(row, MCPPool())  # only its tool schemas are read: no server starts
    prompt_len = len(chat.encode_prompt(row["prompt"], env.tools))
    texts = solved_texts(row)
    traj, _ = play(chat, row, texts, limits(seq=prompt_len + len(chat.encode(texts[0])) + 5))
    assert traj.stop_reason == "length"
    assert traj.env_metrics["overlong"] == 1.0 and sum(traj.loss_mask) == 0
    assert len(traj.prompt_ids) + len(traj.response_ids) >= prompt_len + len(chat.encode(texts[0]))


def test_max_turns_stops_episode(chat: ChatTokenizer, row: dict) -> None:
    call = solved_texts(row)[0]
    traj, engine = play(chat, row, [call, call, call], limits(max_turns=2))
    assert traj.stop_reason == "max_turns" and traj.num_turns == 2 and len(engine.prompts) == 2
    assert traj.reward == 0.0


def test_prompt_too_long_is_refused(chat: ChatTokenizer, row: dict) -> None:
    lim = LoopLimits(max_turns=2, max_input_length=10, max_generate_length=8, max_sequence_length=64)
    with pytest.raises(PromptTooLongError, match="max_input_length"):
        play(chat, row, ["x"], lim)


def test_check_trajectory_catches_tampering(chat: ChatTokenizer, row: dict) -> None:
    texts = solved_texts(row)
    traj, _ = play(chat, row, texts, limits())
    sampled = [[*chat.encode(texts[0]), chat.eos_id], [*chat.encode(texts[1]), chat.eos_id]]
    check_trajectory(traj, sampled)
    s, e, o = traj.turn_spans[0]
    traj.loss_mask[o] = 1 if o < len(traj.loss_mask) and traj.loss_mask[o] == 0 else traj.loss_mask[o]
    traj.loss_mask[e] = 1  # an observation token marked as sampled
    with pytest.raises(TrajectoryInvariantError, match="loss mask"):
        check_trajectory(traj, sampled)
    traj.loss_mask[e] = 0
    traj.response_ids[s] += 1  # a sampled id altered
    with pytest.raises(TrajectoryInvariantError, match="verbatim"):
        check_trajectory(traj, sampled)


def test_random_model_batch_keeps_invariants(chat: ChatTokenizer) -> None:
    """A real engine on an untrained model emits arbitrary text; every trajectory must still check out."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thermik.inference.embedded import EmbeddedEngine

    torch.manual_seed(0)
    tok = chat.tokenizer
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
        )
    )
    engine = EmbeddedEngine(model.eval(), eos_token_ids=chat.stop_ids, pad_token_id=tok.pad_token_id)
    rows = generate_rows("calculator", 3, seed=1, split="train")
    cfg = RolloutConfig(max_generate_length=24, max_sequence_length=600)
    lim = LoopLimits.from_config(cfg, max_turns=3)

    pool = MCPPool()

    def make(row: dict):
        return calc_env(row, pool)

    async def go():
        try:
            first = await rollout_rows(engine, make, chat, rows, 2, lim, SamplingConfig(temperature=1.0), seed=5)
            slots = len(engine.scheduler.slots)
            await rollout_rows(engine, make, chat, rows, 2, lim, SamplingConfig(temperature=1.0), seed=6)
            # every episode ended its session: the second batch took the first batch's slots
            assert len(engine.scheduler.slots) == slots <= 6
            return first
        finally:
            await engine.close()
            await pool.aclose()

    trajs = asyncio.run(go())
    assert len(trajs) == 6 and [t.group_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    for t in trajs:
        assert len(t.rollout_logprobs) == len(t.response_ids)
        assert all(lp <= 0 for lp, m in zip(t.rollout_logprobs, t.loss_mask, strict=True) if m)
        assert t.stop_reason in ("stop", "length", "max_turns")

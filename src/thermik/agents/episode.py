"""One episode played by an agent harness: open a capture episode (thermik.capture) on the engine's endpoint, run the
harness against it (agents/process.py), close the episode (its token-exact samples), score it (agents/scoring.py).
A misbehaving harness fails its episode, never the run (agents/outcome.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from thermik.agents.harness_env import HarnessEnv
from thermik.agents.outcome import finish
from thermik.agents.process import Client, run_harness
from thermik.capture import Capture, EpisodeLimits, serve_capture
from thermik.config.schema import SamplingConfig
from thermik.inference.base import InferenceEngine
from thermik.models.chat import ChatTokenizer
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.trajectory import Trajectory

_CAPTURES: dict[tuple[int, int], asyncio.Task[tuple[Capture, contextlib.AsyncExitStack]]] = {}


async def capture_for(engine: InferenceEngine, chat: ChatTokenizer, model_name: str, max_model_len: int) -> Capture:
    """This engine's capture endpoint in this event loop, served on loopback from first use until the loop ends (one
    per engine and loop: the episodes that start together wait for the same one)."""
    key = (id(engine), id(asyncio.get_running_loop()))
    if key not in _CAPTURES:

        async def start() -> tuple[Capture, contextlib.AsyncExitStack]:
            stack = contextlib.AsyncExitStack()  # kept referenced: its end stops the server
            return await stack.enter_async_context(
                serve_capture(engine, chat.tokenizer, model_name, max_model_len)
            ), stack

        _CAPTURES[key] = asyncio.ensure_future(start())
    return (await asyncio.shield(_CAPTURES[key]))[0]


def run_sampling(sampling: SamplingConfig, seed: int | None) -> dict[str, Any]:
    """The request fields a capture episode fixes to the run's sampling, whatever the harness sends."""
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "min_p": sampling.min_p, **({} if seed is None else {"seed": seed})}  # fmt: skip


def episode_limits(env: HarnessEnv, limits: LoopLimits, sampling: SamplingConfig, seed: int | None) -> EpisodeLimits:
    """The capture's budgets: agent.max_turns (else env.max_turns) and agent.max_tokens; the run's sampling; whether
    the harness's tool schemas are rendered (env.render_tools)."""
    fixed = run_sampling(sampling, seed)
    turns, tokens = env.cfg.max_turns or limits.max_turns, env.cfg.max_tokens or None
    return EpisodeLimits(turns, tokens, limits.step_wise, fixed, env.render_tools)


async def play_episode(
    env: HarnessEnv,
    engine: InferenceEngine,
    chat: ChatTokenizer,
    row: dict[str, Any],
    limits: LoopLimits,
    sampling: SamplingConfig,
    group_id: int,
    seed: int | None,
) -> Trajectory:
    """The harness's episode of `row` as a Trajectory (see the module docstring)."""
    capture = await capture_for(engine, chat, env.cfg.model_name, limits.max_sequence_length)
    handle = capture.open(episode_limits(env, limits, sampling, seed), group_id=group_id)
    try:
        outcome = await run_harness(
            env.cfg, row, Client(handle.base_url, handle.api_key, handle.model, handle.reward_url)
        )
        outcome.posted_reward, outcome.posted_metrics = capture.take_reward(handle.id)
    finally:
        traj = capture.close(handle.id)
    if not traj.prompt_ids:  # the harness never called the model
        traj.prompt_ids = chat.encode_prompt(row["prompt"], env.tools)
    traj.group_id = group_id
    traj.timings["llm"] = outcome.elapsed  # model turns and the harness together
    await finish(env, row, traj, outcome)
    return traj

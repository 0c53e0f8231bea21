"""One episode played by an agent harness: open a capture episode (thermik.capture) on the engine's endpoint, run the
harness against it (agents/process.py), close the episode (its token-exact samples), score it (agents/scoring.py).

A harness that misbehaves fails its episode, never the run: the episode keeps its tokens but trains on nothing
(loss masks zeroed, `env_metrics["masked"]`), its reward is 0, and `env_metrics["agent/failed"]` and
`agent/failed_<reason>` count it (crash, timeout, left_processes, over_budget, no_reward); one line on stderr names
the reason. docs/agents.md, "When a harness misbehaves".
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from thermik.agents.harness_env import HarnessEnv
from thermik.agents.process import Client, HarnessOutcome, run_harness
from thermik.agents.scoring import Score, call_reward_fn, load_function, read_result, score_answer
from thermik.capture import Capture, EpisodeLimits, serve_capture
from thermik.config.schema import SamplingConfig
from thermik.data.chat_tokenizer import ChatTokenizer
from thermik.inference.base import InferenceEngine
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


def episode_limits(env: HarnessEnv, limits: LoopLimits, sampling: SamplingConfig, seed: int | None) -> EpisodeLimits:
    """The capture's budgets: agent.max_turns (else env.max_turns) and agent.max_tokens; the run's sampling."""
    fixed = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
             "min_p": sampling.min_p, **({} if seed is None else {"seed": seed})}  # fmt: skip
    return EpisodeLimits(env.cfg.max_turns or limits.max_turns, env.cfg.max_tokens or None, limits.step_wise, fixed)


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
        outcome = await run_harness(env.cfg, row, Client(handle.base_url, handle.api_key, handle.model))
    finally:
        traj = capture.close(handle.id)
    if not traj.prompt_ids:  # the harness never called the model
        traj.prompt_ids = chat.encode_prompt(row["prompt"], env.tools)
    traj.group_id = group_id
    traj.timings["llm"] = outcome.elapsed  # model turns and the harness together
    await finish(env, row, traj, outcome)
    return traj


async def finish(env: HarnessEnv, row: dict[str, Any], traj: Trajectory, outcome: HarnessOutcome) -> None:
    """Score the episode and place its reward, or fail it with its reason."""
    failure, detail = outcome.failure, outcome.detail
    if failure == "crash" and traj.stop_reason in ("max_turns", "length"):
        failure = "over_budget"  # the endpoint refused a call past agent.max_turns / max_tokens and ended it
    score = Score() if failure else await episode_score(env, row, traj, outcome.result)
    if not failure and score.reward is None:
        failure, detail = "no_reward", "the harness returned no reward nor an answer, and agent.reward_fn is unset"
    traj.env_metrics |= score.metrics
    if failure:
        fail(traj, failure, detail)
    else:
        place_reward(traj, float(score.reward or 0.0))


async def episode_score(env: HarnessEnv, row: dict[str, Any], traj: Trajectory, result: Any) -> Score:
    """agent.reward_fn when set, else the harness's reward, else the env's scorer on its answer."""
    if env.cfg.reward_fn:
        fn = load_function(env.cfg.reward_fn, "agent.reward_fn", env.cfg.cwd)
        return await call_reward_fn(fn, row, result, traj.messages)
    score = read_result(result)
    if score.reward is None and score.answer is not None:
        score.reward = await score_answer(env.inner, row["prompt"], score.answer)
    return score


def place_reward(traj: Trajectory, reward: float) -> None:
    """The episode's reward on the last sampled token of its last sample that sampled anything."""
    last = next((s for s in reversed(traj.samples) if s.turn_spans), None)
    if last is not None:
        last.rewards[last.turn_spans[-1][1] - 1] += reward


def fail(traj: Trajectory, reason: str, detail: str) -> None:
    """A failed episode: counted with its reason, logged, its tokens kept but trained on nothing."""
    for sample in traj.samples:
        sample.loss_mask = [0] * len(sample.loss_mask)
    traj.env_metrics |= {"masked": 1.0, "agent/failed": 1.0, f"agent/failed_{reason}": 1.0}
    if traj.stop_reason == "stop":
        traj.stop_reason = "abort"
    print(f"thermik: agent episode failed ({reason}): {detail}", file=sys.stderr, flush=True)

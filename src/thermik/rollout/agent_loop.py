"""The multi-turn agent loop: engine.generate(token ids) -> text -> env.step -> observation ids, token-in/token-out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thermik.config.schema import RolloutConfig, SamplingConfig
from thermik.envs.base import Env, Message, StepOutput
from thermik.inference.base import Generation, InferenceEngine, SamplingParams
from thermik.rollout.invariants import check_trajectory
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import Trajectory


class PromptTooLongError(ValueError):
    pass


@dataclass(frozen=True)
class LoopLimits:
    max_turns: int
    max_input_length: int
    max_generate_length: int
    max_sequence_length: int

    @classmethod
    def from_config(cls, rollout: RolloutConfig, max_turns: int) -> LoopLimits:
        return cls(max_turns, rollout.max_input_length, rollout.max_generate_length, rollout.max_sequence_length)


def sampling_params(
    cfg: SamplingConfig, max_tokens: int, stop_ids: tuple[int, ...], seed: int | None
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        stop_token_ids=stop_ids,
        seed=seed,
    )


def _record_generation(traj: Trajectory, gen: Generation, chat: ChatTokenizer) -> str:
    """Append one turn's sampled tokens (loss mask 1, their logprobs and weight versions); returns its text."""
    traj.response_ids += gen.token_ids
    traj.loss_mask += [1] * len(gen.token_ids)
    traj.rollout_logprobs += gen.logprobs
    traj.weight_versions += gen.weight_versions or [gen.weight_version] * len(gen.token_ids)
    traj.rewards += [0.0] * len(gen.token_ids)
    text = chat.decode(gen.token_ids)
    traj.messages.append({"role": "assistant", "content": text})
    return text


def _record_step(traj: Trajectory, out: StepOutput) -> None:
    """The env's reward on the turn's last sampled token; tool call/failure counts summed."""
    if traj.rewards:
        traj.rewards[-1] += float(out.reward)
    for key in ("tool_calls", "tool_failures"):
        traj.env_metrics[key] = traj.env_metrics.get(key, 0.0) + float(out.metadata.get(key, 0))


def _record_observations(traj: Trajectory, chat: ChatTokenizer, observations: list[Message]) -> None:
    """Append the observation messages' token ids (loss mask 0, no logprob, weight version -1)."""
    obs_ids = chat.encode_observations(observations)
    traj.messages += observations
    traj.response_ids += obs_ids
    traj.loss_mask += [0] * len(obs_ids)
    traj.rollout_logprobs += [0.0] * len(obs_ids)
    traj.weight_versions += [-1] * len(obs_ids)
    traj.rewards += [0.0] * len(obs_ids)


def _finish(traj: Trajectory, turns: list[list[int]], overlong: bool) -> Trajectory:
    """An overlong episode trains on nothing (loss mask zeroed); then the token-in/token-out check."""
    if overlong:
        traj.loss_mask = [0] * len(traj.loss_mask)
        traj.env_metrics["overlong"] = 1.0
    check_trajectory(traj, turns)
    return traj


async def run_episode(
    engine: InferenceEngine,
    env: Env,
    chat: ChatTokenizer,
    prompt: list[dict[str, Any]],
    limits: LoopLimits,
    sampling: SamplingConfig,
    group_id: int = 0,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode. Rewards sit on each turn's last sampled token; a sequence that outgrows
    max_sequence_length is overlong: stop reason "length" and its loss mask zeroed."""
    messages, _ = await env.ainit(prompt)
    prompt_ids = chat.encode_prompt(messages, env.tools)
    if len(prompt_ids) > limits.max_input_length:
        raise PromptTooLongError(f"prompt has {len(prompt_ids)} tokens > rollout.max_input_length")
    traj = Trajectory(prompt_ids=prompt_ids, group_id=group_id, messages=list(messages), stop_reason="max_turns")
    turns: list[list[int]] = []
    session_id = uuid.uuid4().hex  # the engine keeps this episode's cache between turns
    overlong = False
    try:
        for turn in range(limits.max_turns):
            room = limits.max_sequence_length - len(prompt_ids) - len(traj.response_ids)
            max_tokens = min(limits.max_generate_length, room)
            if max_tokens <= 0:
                traj.stop_reason, overlong = "length", True
                break
            params = sampling_params(sampling, max_tokens, chat.stop_ids, None if seed is None else seed + 7919 * turn)
            t0 = time.perf_counter()
            gen = await engine.generate(prompt_ids + traj.response_ids, params, session_id)
            traj.timings["llm"] += time.perf_counter() - t0
            start = len(traj.response_ids)
            turns.append(list(gen.token_ids))
            traj.num_turns = turn + 1
            text = _record_generation(traj, gen, chat)
            end_sampled = len(traj.response_ids)
            if gen.stop_reason != "stop":
                traj.stop_reason, overlong = gen.stop_reason, max_tokens < limits.max_generate_length
                traj.turn_spans.append((start, end_sampled, end_sampled))
                break
            t0 = time.perf_counter()
            out = await env.astep(text)
            traj.timings["env"] += time.perf_counter() - t0
            _record_step(traj, out)
            if out.done:
                traj.stop_reason = "stop"
                traj.turn_spans.append((start, end_sampled, end_sampled))
                break
            _record_observations(traj, chat, out.observations)
            traj.turn_spans.append((start, end_sampled, len(traj.response_ids)))
            if len(prompt_ids) + len(traj.response_ids) >= limits.max_sequence_length:
                traj.stop_reason, overlong = "length", True
                break
    finally:
        _end_session(engine, session_id)
    return _finish(traj, turns, overlong)


EnvFactory = Callable[[dict[str, Any]], Env]


def _end_session(engine: InferenceEngine, session_id: str) -> None:
    """Tell an engine that keeps per-session caches (the embedded one) that the episode is over."""
    end = getattr(engine, "end_session", None)
    if end is not None:
        end(session_id)


async def rollout_rows(
    engine: InferenceEngine,
    make_env: EnvFactory,
    chat: ChatTokenizer,
    rows: list[dict[str, Any]],
    group_size: int,
    limits: LoopLimits,
    sampling: SamplingConfig,
    seed: int | None = None,
) -> list[Trajectory]:
    """All episodes of a batch run concurrently; rows[i] yields group i of `group_size` samples."""
    tasks = [
        rollout_row(engine, make_env, chat, row, limits, sampling, g, None if seed is None else seed + 1000 * g + k)
        for g, row in enumerate(rows)
        for k in range(group_size)
    ]
    return list(await asyncio.gather(*tasks))


async def rollout_row(
    engine: InferenceEngine,
    make_env: EnvFactory,
    chat: ChatTokenizer,
    row: dict[str, Any],
    limits: LoopLimits,
    sampling: SamplingConfig,
    group_id: int,
    seed: int | None,
) -> Trajectory:
    """One episode of a dataset row in a fresh environment (closed afterwards)."""
    env = make_env(row)
    try:
        traj = await run_episode(engine, env, chat, row["prompt"], limits, sampling, group_id, seed)
    finally:
        await env.aclose()
    traj.env_name = row.get("env_class", "")
    return traj

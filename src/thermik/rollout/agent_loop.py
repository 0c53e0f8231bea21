"""The multi-turn agent loop: engine.generate(token ids) -> text -> env.step -> observation ids, token-in/token-out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from thermik.config.schema import RolloutConfig, SamplingConfig
from thermik.envs.base import Env, StepOutput
from thermik.errors import ThermikError
from thermik.inference.base import InferenceEngine, SamplingParams
from thermik.models.chat import ChatTokenizer, NextPrompt, PromptHistory
from thermik.rollout.step_wise import EpisodeSamples, StepWise
from thermik.rollout.thinking import assistant_message, split_thinking, think_token_ids, thinking_token_count
from thermik.rollout.trajectory import Trajectory

ContextPolicy = Literal["truncate-episode", "drop-oldest-observations", "summarise"]


class PromptTooLongError(ValueError):
    """A prompt longer than rollout.max_input_length: its row is skipped and counted, never played."""

    def __init__(self, tokens: int = 0, limit: int = 0, detail: str = "") -> None:
        self.tokens, self.limit = tokens, limit  # 0: not known (a server refused the prompt: `detail`)
        super().__init__(detail or f"prompt has {tokens} tokens > rollout.max_input_length = {limit}")


NO_WINDOW = 1 << 30
"""The sequence length when no context window is known (an API policy: its server enforces its own)."""


@dataclass(frozen=True)
class LoopLimits:
    max_turns: int
    max_input_length: int
    max_generate_length: int
    max_sequence_length: int
    step_wise: StepWise = "on-break"
    context: ContextPolicy = "truncate-episode"
    context_placeholder: str = RolloutConfig.model_fields["context_placeholder"].default
    summary_request: str = RolloutConfig.model_fields["summary_request"].default
    window: int | None = None  # the model's context window the 0 (default) lengths came from; None: unknown

    @classmethod
    def from_config(cls, rollout: RolloutConfig, max_turns: int, window: int | None = None) -> LoopLimits:
        """The limits of `rollout`, its 0 lengths resolved: max_sequence_length = the model's context `window`,
        max_input_length = max_sequence_length - max_generate_length (docs/reliability.md)."""
        generate = rollout.max_generate_length
        sequence = rollout.max_sequence_length or window or NO_WINDOW
        prompt = rollout.max_input_length or sequence - generate
        if prompt < 1 or prompt + generate > sequence:
            raise ThermikError(
                f"rollout.max_input_length ({prompt}) + rollout.max_generate_length ({generate}) exceed the "
                f"model's context window ({sequence}); lower them"
            )
        return cls(
            max_turns,
            prompt,
            generate,
            sequence,
            rollout.step_wise,
            rollout.context,
            rollout.context_placeholder,
            rollout.summary_request,
            window,
        )


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


def _record_step(traj: Trajectory, episode: EpisodeSamples, out: StepOutput) -> None:
    """The env's reward on the turn's last sampled token; tool call/failure counts summed."""
    episode.add_reward(float(out.reward))
    for key in ("tool_calls", "tool_failures"):
        traj.env_metrics[key] = traj.env_metrics.get(key, 0.0) + float(out.metadata.get(key, 0))
    for key, value in out.metadata.get("env_metrics", {}).items():  # an env's own metrics ("<env>/<name>")
        traj.env_metrics[key] = traj.env_metrics.get(key, 0.0) + float(value)
    if out.metadata.get("mask_episode"):  # the env asks that the episode train on nothing (e.g. it did not finish)
        traj.env_metrics["masked"] = 1.0


def _next_prompt(history: PromptHistory, episode: EpisodeSamples, limits: LoopLimits) -> NextPrompt | None:
    """The next prompt under the context policy; None when the episode must stop for length (truncate-episode).
    drop-oldest-observations replaces old tool results until the prompt fits; summarise asks for a summary."""
    prompt = history.render_next()
    too_long = lambda p: history.tokens_count(p, episode.current_length()) > limits.max_input_length  # noqa: E731
    if limits.context == "truncate-episode" or not too_long(prompt):
        return prompt
    if limits.context == "drop-oldest-observations":
        while too_long(prompt) and history.drop_oldest_observation(limits.context_placeholder):
            prompt = history.render_next()
        episode.head.env_metrics["context_drops"] = episode.head.env_metrics.get("context_drops", 0.0) + 1.0
        return None if too_long(prompt) else prompt
    history.add_user(limits.summary_request)
    episode.head.messages.append(history.messages[-1])
    episode.head.env_metrics["context_summaries"] = episode.head.env_metrics.get("context_summaries", 0.0) + 1.0
    return history.render_next()


@dataclass
class _EpisodeRun:
    """One running episode: what each turn needs, and whether the next sampled turn is the summary."""

    engine: InferenceEngine
    env: Env
    chat: ChatTokenizer
    history: PromptHistory
    episode: EpisodeSamples
    limits: LoopLimits
    sampling: SamplingConfig
    seed: int | None
    session_id: str
    summary_next: bool = False
    overlong: bool = False

    def stop(self, reason: str, overlong: bool) -> bool:
        self.episode.head.stop_reason, self.overlong = reason, overlong
        return False

    async def turn(self, turn: int) -> bool:
        """Generate, step the env (or take the summary), then the next prompt; False ends the episode."""
        traj, limits, chat = self.episode.head, self.limits, self.chat
        max_tokens = min(limits.max_generate_length, limits.max_sequence_length - self.episode.current_length())
        if max_tokens <= 0:
            return self.stop("length", True)
        seed = None if self.seed is None else self.seed + 7919 * turn
        params = sampling_params(self.sampling, max_tokens, chat.stop_ids, seed)
        t0 = time.perf_counter()
        gen = await self.engine.generate(self.episode.current_ids(), params, self.session_id)
        traj.timings["llm"] += time.perf_counter() - t0
        traj.num_turns = turn + 1
        self.episode.add_generation(gen)
        text = chat.decode(gen.token_ids)
        self.history.add_sampled(gen.token_ids, text)
        traj.messages.append(assistant_message(text))
        _count_thinking(traj, chat, gen.token_ids)
        if gen.stop_reason != "stop":
            return self.stop(gen.stop_reason, max_tokens < limits.max_generate_length)
        if self.summary_next:
            self.history.restart_from_summary(split_thinking(text)[1])
        elif not await self._step_env(split_thinking(text)[1]):
            return self.stop("stop", False)
        summaries = traj.env_metrics.get("context_summaries", 0.0)
        prompt = _next_prompt(self.history, self.episode, limits)
        if prompt is None:
            return self.stop("length", True)
        self.summary_next = traj.env_metrics.get("context_summaries", 0.0) > summaries
        self.history.commit(prompt)
        self.episode.advance(prompt.ids, prompt.extends)
        if self.episode.current_length() >= limits.max_sequence_length:
            return self.stop("length", True)
        return True

    async def _step_env(self, answer: str) -> bool:
        """The env's step on the turn's answer (thinking removed); False when the episode is done."""
        traj = self.episode.head
        t0 = time.perf_counter()
        out = await self.env.astep(answer)
        traj.timings["env"] += time.perf_counter() - t0
        _record_step(traj, self.episode, out)
        if out.done:
            return False
        self.history.add_observations(out.observations)
        traj.messages += out.observations
        return True


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
    """Play one episode. Rewards sit on each turn's last sampled token; a sample that outgrows
    max_sequence_length is overlong: stop reason "length" and the episode's loss masks zeroed. The episode's
    step-wise samples are the returned trajectory and its `continuations` (limits.step_wise)."""
    messages, _ = await env.ainit(prompt)
    history = PromptHistory(chat, messages, env.tools)
    prompt_ids = history.prompt_ids()
    if len(prompt_ids) > limits.max_input_length:
        raise PromptTooLongError(len(prompt_ids), limits.max_input_length)
    traj = Trajectory(prompt_ids=prompt_ids, group_id=group_id, messages=list(messages), stop_reason="max_turns")
    episode = EpisodeSamples(traj, limits.step_wise)
    run = _EpisodeRun(engine, env, chat, history, episode, limits, sampling, seed, uuid.uuid4().hex)
    try:
        for turn in range(limits.max_turns):
            if not await run.turn(turn):
                break
    finally:
        _end_session(engine, run.session_id)  # the engine kept this episode's cache between turns
    return episode.finish(run.overlong, masked=traj.env_metrics.get("masked", 0.0) > 0)


def _count_thinking(traj: Trajectory, chat: ChatTokenizer, sampled: list[int]) -> None:
    tags = think_token_ids(chat.tokenizer)
    if tags is not None:
        count = float(thinking_token_count(sampled, tags))
        traj.env_metrics["thinking_tokens"] = traj.env_metrics.get("thinking_tokens", 0.0) + count


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
    too_long: list[int] | None = None,
) -> list[Trajectory]:
    """All episodes of a batch run concurrently; rows[i] yields group i of `group_size` samples. With `too_long`
    given, a row whose prompt exceeds rollout.max_input_length yields no group (the others keep their group ids)
    and its prompt's length is appended there, once per row; without it, PromptTooLongError propagates."""

    async def episode(g: int, row: dict[str, Any], k: int) -> Trajectory | PromptTooLongError:
        try:
            return await rollout_row(
                engine, make_env, chat, row, limits, sampling, g, None if seed is None else seed + 1000 * g + k
            )
        except PromptTooLongError as e:
            if too_long is None:
                raise
            return e

    got = await asyncio.gather(*(episode(g, row, k) for g, row in enumerate(rows) for k in range(group_size)))
    if too_long is not None:
        too_long += {i // group_size: e.tokens for i, e in enumerate(got) if isinstance(e, PromptTooLongError)}.values()
    return [t for t in got if isinstance(t, Trajectory)]


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
        play = getattr(env, "play", None)
        if play is not None:  # an agent harness or verifiers plays it against a capture endpoint (thermik.agents)
            traj = await play(engine, chat, row, limits, sampling, group_id, seed)
        else:
            traj = await run_episode(engine, env, chat, row["prompt"], limits, sampling, group_id, seed)
    finally:
        await env.aclose()
    traj.env_name = row.get("env_class", "")
    return traj

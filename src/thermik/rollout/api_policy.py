"""An OpenAI-compatible chat endpoint as the policy of an evaluation (a hosted model, vLLM, `thermik inference`).

The conversation goes to the chat API with the env's `tools`; the returned tool calls are written back in the
env's tool-call format (`env.tool_parser`) so the env reads the turn exactly as it reads a local model's text.
No token ids: the episode's Trajectory has messages, per-turn rewards and a stop reason only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from thermik.config.schema import PolicyConfig, SamplingConfig
from thermik.envs.base import Env, Message
from thermik.errors import ThermikError
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, PromptTooLongError
from thermik.rollout.thinking import assistant_message, split_thinking
from thermik.rollout.trajectory import Trajectory
from thermik.tools.parsers import TOOL_CALL_FORMATTERS


def _action_text(message: Any, tool_parser: str) -> tuple[str, list[dict[str, Any]]]:
    """(the turn as text in the env's tool-call format, the calls as chat messages carry them); thinking in the content
    (`<think>...</think>`) never reaches the env."""
    parts = [split_thinking(message.content or "")[1]]
    calls = []
    for call in message.tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {"_unparsed": call.function.arguments}
        parts.append(TOOL_CALL_FORMATTERS[tool_parser](call.function.name, arguments))
        calls.append({"id": call.id, "type": "function", "function": call.function.model_dump()})
    return "\n".join(p for p in parts if p), calls


def _root_cause(error: BaseException) -> str:
    """The innermost cause of a connection error (openai's own message is only 'Connection error.')."""
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error) or type(error).__name__


def _tool_messages(observations: list[Message], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Env observations as chat messages: tool results paired with the turn's call ids by position."""
    out = []
    for i, obs in enumerate(observations):
        if obs.get("role") == "tool" and calls:
            call_id = calls[min(i, len(calls) - 1)]["id"]
            out.append({"role": "tool", "tool_call_id": call_id, "content": str(obs.get("content", ""))})
        else:
            out.append({"role": obs.get("role", "user"), "content": str(obs.get("content", ""))})
    return out


class ApiPolicy:
    """Plays episodes against a chat endpoint; `close()` releases the HTTP client."""

    def __init__(
        self, cfg: PolicyConfig, make_env: EnvFactory, limits: LoopLimits, sampling: SamplingConfig, tool_parser: str
    ) -> None:
        from openai import AsyncOpenAI  # optional extra `llm`

        self.client = AsyncOpenAI(base_url=cfg.base_url, api_key=cfg.api_key, timeout=cfg.timeout_s, max_retries=1)
        self.cfg, self.make_env, self.limits, self.sampling = cfg, make_env, limits, sampling
        self.tool_parser = tool_parser
        self.model = cfg.model
        self._slots = asyncio.Semaphore(cfg.max_concurrency)

    async def _model_name(self) -> str:
        if not self.model:
            models = (await self.client.models.list()).data
            if not models:
                raise ThermikError(f"--policy.base_url {self.cfg.base_url} lists no model", hint="set --policy.model")
            self.model = models[0].id
        return self.model

    async def _complete(self, convo: list[dict[str, Any]], env: Env, seed: int | None) -> Any:
        import openai

        tools = {"tools": env.tools} if env.tools else {}
        async with self._slots:
            try:
                return await self.client.chat.completions.create(
                    model=await self._model_name(), messages=convo, max_tokens=self.limits.max_generate_length,
                    temperature=self.sampling.temperature, top_p=self.sampling.top_p, seed=seed, **tools,
                )  # fmt: skip
            except openai.BadRequestError as e:
                if "long" in str(e).lower() or "context" in str(e).lower():
                    raise PromptTooLongError(detail=str(e)) from e
                raise
            except openai.APIConnectionError as e:
                cause = _root_cause(e)
                raise ThermikError(
                    f"cannot reach --policy.base_url {self.cfg.base_url}: {cause}",
                    hint="start the server or fix the URL",
                ) from e

    async def __call__(self, row: dict[str, Any], problem: int, seed: int | None) -> Trajectory:
        env = self.make_env(row)
        try:
            return await self._episode(env, row, problem, seed)
        finally:
            await env.aclose()

    async def _episode(self, env: Env, row: dict[str, Any], problem: int, seed: int | None) -> Trajectory:
        messages, _ = await env.ainit(row["prompt"])
        traj = Trajectory(prompt_ids=[], group_id=problem, messages=list(messages), stop_reason="max_turns")
        traj.env_name = row.get("env_class", "")
        convo: list[dict[str, Any]] = [dict(m) for m in messages]
        for turn in range(self.limits.max_turns):
            choice = (await self._complete(convo, env, seed)).choices[0]
            text, calls = _action_text(choice.message, self.tool_parser)
            traj.num_turns = turn + 1
            traj.messages.append(assistant_message(choice.message.content or "") | {"content": text})
            convo.append(
                {"role": "assistant", "content": choice.message.content or ""}
                | ({"tool_calls": calls} if calls else {})
            )
            if choice.finish_reason == "length":
                traj.stop_reason = "length"
                break
            out = await env.astep(text)
            traj.rewards.append(float(out.reward))
            for key in ("tool_calls", "tool_failures"):
                traj.env_metrics[key] = traj.env_metrics.get(key, 0.0) + float(out.metadata.get(key, 0))
            if out.done:
                traj.stop_reason = "stop"
                break
            traj.messages += out.observations
            convo += _tool_messages(out.observations, calls)
        return traj

    async def close(self) -> None:
        await self.client.close()

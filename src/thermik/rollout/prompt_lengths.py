"""How long a task's prompts are, measured the way the agent loop renders them (env.init, then the chat template with
the env's tools), so a length limit too small for every prompt is refused before any work (runs/verdict.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thermik.models.chat import ChatTokenizer, PromptHistory
from thermik.rollout.agent_loop import EnvFactory


@dataclass(frozen=True)
class PromptLengths:
    tokens: list[int]  # one per measured row
    tools: bool  # some env renders tool schemas into its prompt (env.render_tools)


async def measure_prompts(make_env: EnvFactory, chat: ChatTokenizer, rows: list[dict[str, Any]]) -> PromptLengths:
    """The first prompt of each row in a fresh env (closed afterwards). Envs that play their own episodes
    (verifiers) are not measured."""
    tokens, tools = [], False
    for row in rows:
        env = make_env(row)
        try:
            if env.plays_episode:
                continue
            messages, _ = await env.ainit(row["prompt"])
            tokens.append(len(PromptHistory(chat, messages, env.tools).prompt_ids()))
            tools = tools or bool(env.tools)
        finally:
            await env.aclose()
    return PromptLengths(tokens, tools)

"""The environment contract (skyrl-gym shaped): init(prompt) -> step(action) ... -> close()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

Message = dict[str, Any]
"""A chat message: {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}."""


@dataclass
class StepOutput:
    """What one env.step returns.

    observations: messages appended to the conversation (e.g. a tool result); empty when done.
    reward: reward of the turn just taken, placed on that turn's last sampled token.
    done: the episode is over.
    metadata: free-form; the loop reads `tool_calls` (int) and `tool_failures` (int) when present.
    """

    observations: list[Message]
    reward: float
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


class Env:
    """Base class of thermik environments. `astep`/`ainit`/`aclose` default to the sync versions.

    An environment built for one dataset row gets the row's `reward_spec` and `extra_info`
    through its constructor (see thermik.envs.registry.make).
    """

    uses_mcp_pool: ClassVar[bool] = False
    """True: the constructor also takes `pool` (the run's MCPPool, owned and closed by the run) for its tool calls."""
    plays_episode: ClassVar[bool] = False
    """True: another framework plays the whole episode, calling the engine back through the token-in endpoint
    (`verifiers:<taskset>`, thermik.agents.verifiers_episode); the agent loop calls neither init nor step."""

    tools: list[dict[str, Any]] | None = None
    """OpenAI-style function schemas rendered into the prompt by the chat template, or None."""

    def init(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        return prompt, {}

    def step(self, action: str) -> StepOutput:
        raise NotImplementedError

    def close(self) -> None:
        return None

    async def ainit(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        return self.init(prompt)

    async def astep(self, action: str) -> StepOutput:
        return self.step(action)

    async def aclose(self) -> None:
        self.close()

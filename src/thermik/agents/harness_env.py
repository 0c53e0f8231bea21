"""The env of a row when an agent harness plays it (`[agent]`): the row's own env kept as the answer scorer, and
`play` for the agent loop (rollout/agent_loop.py calls it instead of its own turns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from thermik.config.agent import AgentConfig
from thermik.envs.base import Env, StepOutput


class HarnessEnv(Env):
    """A row played by `agent.entrypoint` / `agent.command` against a capture endpoint (thermik.agents.episode)."""

    plays_episode: ClassVar[bool] = True

    def __init__(self, inner: Env, cfg: AgentConfig, row: dict[str, Any], render_tools: bool = True) -> None:
        self.inner, self.cfg, self.row, self.render_tools = inner, cfg, row, render_tools
        self.tools = inner.tools

    def step(self, action: str) -> StepOutput:
        raise RuntimeError("an agent harness plays this episode; the agent loop never steps it")

    async def play(self, *args: Any, **kwargs: Any) -> Any:
        from thermik.agents.episode import play_episode

        return await play_episode(self, *args, **kwargs)

    async def aclose(self) -> None:
        await self.inner.aclose()


def harness_env_factory(
    make_env: Callable[[dict[str, Any]], Env], cfg: AgentConfig, render_tools: bool = True
) -> Callable[[dict[str, Any]], Env]:
    """`make_env` when no harness is configured, else each row's env wrapped for the harness; `render_tools`
    (env.render_tools) off keeps the harness's tool schemas out of the prompt."""
    if not cfg.enabled:
        return make_env
    try:  # the capture endpoint is served by fastapi: say so before any episode, not once per failed episode
        import fastapi  # noqa: F401
    except ModuleNotFoundError as e:  # the CLI prints an ImportError as one line, exit 2, like every missing extra
        raise ImportError(
            "agent.entrypoint / agent.command play against a capture endpoint, which needs the 'serve' extra: "
            f'pip install -e ".[serve]" ({e})'
        ) from None
    return lambda row: HarnessEnv(make_env(row), cfg, row, render_tools)

"""Config section of an agent harness that plays each episode itself (docs/agents.md; rollout/agent_harness.py).

The harness is the user's own agent code: a Python function (`entrypoint`) or any program (`command`), pointed at a
per-episode OpenAI-compatible base URL. thermik records what it sends and receives there as the episode's samples.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from thermik.config.base import Section

ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class AgentConfig(Section):
    """`--agent.entrypoint pkg.module:function` or `--agent.command "..."`: the agent that plays every episode."""

    entrypoint: str = Field(
        "", description="'pkg.module:function' called once per episode with (task row, client config: base_url, "
        "api_key, model); sync or async. It returns a reward, a dict of rewards and metrics, or an answer string for "
        "the env's scorer (docs/agents.md)."
    )  # fmt: skip
    command: str = Field(
        "", description="A shell command run once per episode (any venv), with OPENAI_BASE_URL, OPENAI_API_KEY, "
        "OPENAI_MODEL, THERMIK_TASK (the row as JSON), EPISODE_REWARD_URL and THERMIK_RESULT_FILE in its environment; "
        "its result is stdout's last JSON line, or THERMIK_RESULT_FILE's content when it wrote one."
    )  # fmt: skip
    python: str = Field(
        "", description="The Python interpreter `entrypoint` runs in (e.g. the harness venv's bin/python, "
        "scripts/harness_venv.sh); empty: thermik's own."
    )  # fmt: skip
    preload: bool = Field(
        False, description="agent.entrypoint only: import its module once, in a server that forks one process per "
        "episode, instead of starting the interpreter for each episode (an episode's process, timeout and kill are "
        "unchanged). Saves the harness's import time per episode; leave off for a module that starts threads or an "
        "event loop when imported."
    )  # fmt: skip
    cwd: str = Field("", description="Working directory of `command` (and where `entrypoint` is imported from); "
                     "empty: the current one.")  # fmt: skip
    timeout_s: float = Field(
        300.0, gt=0, description="An episode whose harness runs longer is stopped (its whole process tree killed) "
        "and counted as a failure, 'timeout'."
    )  # fmt: skip
    max_turns: int = Field(
        0, ge=0, description="Most model calls per episode; one more is refused (HTTP 400) and ends the episode. "
        "0: env.max_turns."
    )  # fmt: skip
    max_tokens: int = Field(
        0, ge=0, description="Most sampled tokens per episode, all turns together; over it the endpoint refuses "
        "(HTTP 400) and ends the episode. 0: no budget beyond rollout.max_sequence_length."
    )  # fmt: skip
    reward_fn: str = Field(
        "", description="'pkg.module:function' called with (task row, result, messages) returning a reward or a "
        "dict of rewards; overrides the harness's own reward. Empty: the harness's reward, a POST to the episode's "
        "reward URL, or the env's scorer on the answer (docs/agents.md)."
    )  # fmt: skip
    model_name: str = Field("thermik-policy", description="The model name the harness is given (OPENAI_MODEL) when "
                            "thermik's engine serves the episode.")  # fmt: skip

    @property
    def enabled(self) -> bool:
        return bool(self.entrypoint or self.command)

    @field_validator("entrypoint", "reward_fn")
    @classmethod
    def _import_path(cls, value: str) -> str:
        if value and not ENTRYPOINT.fullmatch(value):
            raise ValueError("expected 'pkg.module:function'")
        return value

    @model_validator(mode="after")
    def _one_harness(self) -> AgentConfig:
        if self.entrypoint and self.command:
            raise ValueError("agent.entrypoint and agent.command exclude each other: set one")
        return self

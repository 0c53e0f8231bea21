"""An episode's reward from what the harness returned: a number, a dict of rewards and metrics, or an answer for
the env's scorer; `agent.reward_fn` overrides all of these (docs/agents.md, "Rewards")."""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any

from thermik.envs.base import Env
from thermik.errors import ThermikError


@dataclass
class Score:
    reward: float | None = None  # None: no source gave one
    metrics: dict[str, float] = field(default_factory=dict)
    answer: str | None = None


def read_result(result: Any) -> Score:
    """A number is the reward; a string the answer; a dict may hold `reward` (else the sum of `rewards`), `rewards`
    (named parts, kept as metrics `reward/<name>`), `metrics` (numbers) and `answer`."""
    if isinstance(result, (int, float)):  # bool too
        return Score(float(result))
    if isinstance(result, str):
        return Score(answer=result)
    if not isinstance(result, dict):
        return Score()
    parts = {k: float(v) for k, v in (result.get("rewards") or {}).items() if _number(v)}
    reward = result.get("reward")
    metrics = {f"reward/{k}": v for k, v in parts.items()}
    metrics |= {k: float(v) for k, v in (result.get("metrics") or {}).items() if _number(v)}
    total = float(reward) if _number(reward) else (sum(parts.values()) if parts else None)
    answer = result.get("answer")
    return Score(total, metrics, None if answer is None else str(answer))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float))


def load_function(path: str, setting: str, cwd: str = "") -> Any:
    """The function `pkg.module:function` names (imported from `cwd` too), or a ThermikError naming `setting`."""
    module_name, _, name = path.partition(":")
    if cwd and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ThermikError(f"{setting} = {path!r} cannot be imported: {exc}") from exc


async def call_reward_fn(fn: Any, task: dict[str, Any], result: Any, messages: list[dict[str, Any]]) -> Score:
    """`agent.reward_fn(task, result, messages)`, sync or async, read like a harness's result."""
    value = fn(task, result, messages)
    if inspect.isawaitable(value):
        value = await value
    return read_result(value)


async def score_answer(env: Env, prompt: list[dict[str, Any]], answer: str) -> float:
    """The env's own scorer on the harness's final answer: init on the row's prompt, one step with the answer."""
    await env.ainit(prompt)
    return float((await env.astep(answer)).reward)

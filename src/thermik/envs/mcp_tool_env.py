"""MCPToolEnv (`mcp`): any MCP server(s) as a multi-turn tool-use environment.

Servers come from the row (`extra_info["mcp_servers"]`: names of `env.mcp_servers` entries, or
dicts with every MCPServerEntry option) or, when the row names none, all of `env.mcp_servers`.
Local Python tools come from `env.tool_groups`. At `ainit` the tools are discovered with
list_tools and become `env.tools`, which the chat template renders into the prompt.

Each turn: an `<answer>...</answer>` ends the episode; otherwise tool calls (parsed with
`env.tool_parser`) run in order and their results (or clear errors) are the observations; a
turn with neither ends the episode. The reward is given once, at the end, from
`reward_spec["ground_truth"]`:

- `must_call_tool`: true (any tool) or a tool name. A gate: not met -> reward 0.
- `tool_sequence`: [{"tool": name, "parameters": {...}}, ...], checked in order against the
  successful calls: step k matches the first later call of that tool whose arguments contain the
  given parameters (equal as JSON values; numbers by value; strings ignoring case and surrounding
  space). Score = matched prefix / len(sequence) (`sequence_credit: "partial"`, the default) or
  1 only when all match (`"all"`).
- `answer`: a string/number or a list of accepted ones, compared with the `<answer>` text the
  same way. Score 1 or 0. A ground truth that is a bare value means `{"answer": value}`, so the
  calculator's rows run unchanged with `env.name = "mcp"`.

reward = mean of the `tool_sequence` and `answer` scores present (1.0 when only the gate is
given). `limits` ({"max_servers", "max_tools"}, in ground_truth; capped by `env.mcp_max_*`) are
checked when the env is built / its tools discovered, and a breach raises ToolLimitError.
"""

from __future__ import annotations

import importlib
import math
import re
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, Message, StepOutput
from thermik.envs.tool_use import answer_calls
from thermik.tools.local import LocalTool, ToolGroup
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.mcp_server_config import MCPServerEntry, parse_server_entry
from thermik.tools.parsers import ToolCall, get_parser
from thermik.tools.toolbox import Toolbox, ToolLimitError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class MCPToolEnv(Env):
    """Tool use over MCP servers and local tools; see the module docstring for rows and reward."""

    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        truth = reward_spec.get("ground_truth", {})
        if isinstance(truth, int | float | str) and not isinstance(truth, bool):
            truth = {"answer": truth}  # a bare value (as calculator rows carry) is the expected answer
        if not isinstance(truth, dict):
            raise ValueError(
                f"mcp: reward_spec['ground_truth'] must be a dict or an answer value, got {type(truth).__name__}"
            )
        self.ground_truth = truth
        self.pool = pool
        self.options = options
        self.extra_info = extra_info
        self.parse = get_parser(options.tool_parser)
        limits = truth.get("limits") or {}
        self.max_servers = min(int(limits.get("max_servers", options.mcp_max_servers)), options.mcp_max_servers)
        self.max_tools = min(int(limits.get("max_tools", options.mcp_max_tools)), options.mcp_max_tools)
        self.servers = _row_servers(extra_info.get("mcp_servers"), options.mcp_servers)
        if len(self.servers) > self.max_servers:
            raise ToolLimitError(
                f"mcp: the row uses {len(self.servers)} MCP servers ({', '.join(s.name for s in self.servers)}) "
                f"but limits.max_servers is {self.max_servers}"
            )
        self.toolbox: Toolbox | None = None
        self.tool_schemas: list[dict[str, Any]] = []
        self.successful_calls: list[ToolCall] = []
        self.num_tool_calls = 0
        self.num_tool_failures = 0

    def init(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        raise TypeError("MCPToolEnv discovers its tools asynchronously: use `await env.ainit(prompt)`")

    def step(self, action: str) -> StepOutput:
        raise TypeError("MCPToolEnv calls MCP servers asynchronously: use `await env.astep(action)`")

    async def ainit(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        """Open this rollout's tool sessions and discover the tools (raises if a server cannot start)."""
        toolbox = Toolbox(self.pool, self.options.tool_timeout_s, self.options.tool_max_output_chars)
        self.toolbox = toolbox
        for path in self.options.tool_groups:
            toolbox.add_local(_load_local_tools(path))
        for server in self.servers:
            await toolbox.add_server(server.spec(), only=server.tools or None)
        if len(toolbox.names) > self.max_tools:
            raise ToolLimitError(
                f"mcp: {len(toolbox.names)} tools discovered ({', '.join(toolbox.names)}) but limits.max_tools is "
                f"{self.max_tools}; list the ones to expose in the server entry's 'tools'"
            )
        self.tool_schemas = toolbox.specs
        self.tools = self.tool_schemas if self.options.render_tools else None
        return prompt, {"tools": toolbox.names}

    async def astep(self, action: str) -> StepOutput:
        if self.toolbox is None:
            raise RuntimeError("MCPToolEnv.astep before ainit")
        answer = _ANSWER.search(action)
        parsed = self.parse(action, self.tool_schemas) if answer is None else None
        if parsed is None or not parsed.found:
            reward, parts = episode_reward(self.ground_truth, self.successful_calls, answer and answer.group(1))
            return StepOutput(observations=[], reward=reward, done=True, metadata={**self._metrics(0, 0), **parts})
        answered = await answer_calls(parsed, self.toolbox.call, self.options)
        self.successful_calls.extend(answered.succeeded)
        metrics = self._metrics(len(parsed.items), answered.failures)
        return StepOutput(observations=answered.observations, reward=0.0, done=False, metadata=metrics)

    async def aclose(self) -> None:
        if self.toolbox is not None:
            await self.toolbox.aclose()

    def _metrics(self, calls: int, failures: int) -> dict[str, int]:
        self.num_tool_calls += calls
        self.num_tool_failures += failures
        return {"tool_calls": calls, "tool_failures": failures}


# ---------------------------------------------------------------- reward (pure functions)


def episode_reward(truth: dict[str, Any], calls: list[ToolCall], answer: str | None) -> tuple[float, dict[str, float]]:
    """(reward, its parts) for the successful `calls` and the final `answer` text; see the module docstring."""
    parts: dict[str, float] = {}
    must = truth.get("must_call_tool")
    if must:
        called = any(c.name == must for c in calls) if isinstance(must, str) else bool(calls)
        parts["reward/must_call_tool"] = float(called)
        if not called:
            return 0.0, parts
    scores = []
    if truth.get("tool_sequence"):
        all_or_nothing = truth.get("sequence_credit", "partial") == "all"
        parts["reward/tool_sequence"] = sequence_score(truth["tool_sequence"], calls, all_or_nothing)
        scores.append(parts["reward/tool_sequence"])
    if "answer" in truth:
        parts["reward/answer"] = answer_score(truth["answer"], answer)
        scores.append(parts["reward/answer"])
    return (sum(scores) / len(scores) if scores else 1.0), parts


def sequence_score(expected: list[dict[str, Any]], calls: list[ToolCall], all_or_nothing: bool = False) -> float:
    """Fraction of the expected steps matched in order (a prefix), or 0/1 when `all_or_nothing`."""
    matched, position = 0, 0
    for step in expected:
        tool, params = step.get("tool") or step.get("name"), step.get("parameters") or step.get("arguments") or {}
        found = next(
            (i for i in range(position, len(calls)) if calls[i].name == tool and _contains(calls[i].arguments, params)),
            None,
        )
        if found is None:
            break
        matched, position = matched + 1, found + 1
    if all_or_nothing:
        return float(matched == len(expected))
    return matched / len(expected)


def answer_score(expected: Any, answer: str | None) -> float:
    if answer is None:
        return 0.0
    accepted = expected if isinstance(expected, list) else [expected]
    return float(any(values_match(option, answer) for option in accepted))


def values_match(expected: Any, actual: Any) -> bool:
    """Numbers by value (also numeric strings), strings ignoring case/surrounding space, containers recursively."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and _contains(actual, expected) and set(actual) == set(expected)
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(values_match(e, a) for e, a in zip(expected, actual, strict=True))
        )
    left, right = _number(expected), _number(actual)
    if left is not None and right is not None:
        return math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, str) and isinstance(actual, str):
        return " ".join(expected.split()).casefold() == " ".join(actual.split()).casefold()
    return expected == actual


def _contains(arguments: dict[str, Any], params: dict[str, Any]) -> bool:
    return all(key in arguments and values_match(value, arguments[key]) for key, value in params.items())


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip().replace(",", ""))
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


# ---------------------------------------------------------------- servers and local tools


def _row_servers(row_servers: Any, configured: list[str]) -> list[MCPServerEntry]:
    """The row's servers: names of configured entries or full dicts; all configured ones when the row names none."""
    by_name = {entry.name: entry for entry in map(parse_server_entry, configured)}
    if row_servers is None:
        return list(by_name.values())
    if not isinstance(row_servers, list):
        raise ValueError(f"mcp: extra_info['mcp_servers'] must be a list, got {type(row_servers).__name__}")
    servers = []
    for item in row_servers:
        if isinstance(item, str) and "=" not in item:
            if item not in by_name:
                raise ValueError(f"mcp: the row names MCP server {item!r}; env.mcp_servers has {sorted(by_name)}")
            servers.append(by_name[item])
        else:
            servers.append(parse_server_entry(item))
    return servers


def _load_local_tools(path: str) -> ToolGroup | LocalTool:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"env.tool_groups entries must look like 'pkg.mod:attr', got {path!r}")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"env.tool_groups: cannot load {path!r}: {exc}") from exc
    if not isinstance(value, ToolGroup | LocalTool):
        raise ValueError(f"env.tool_groups: {path!r} is a {type(value).__name__}, not a ToolGroup or @tool")
    return value

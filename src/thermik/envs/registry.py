"""Environment registry: one explicit name table plus user `register` calls; `make` builds one env.

Every env constructor takes keyword arguments `reward_spec`, `extra_info` and `options`
(the validated EnvConfig), plus `pool` (the run's MCPPool) when the class sets `uses_mcp_pool`;
nothing else is passed through. The built-in tasks' envs live in thermik.tasks, which passes its
name table in as `builtins` (this package never imports thermik.tasks).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env
from thermik.errors import ThermikError
from thermik.tools.mcp_pool import MCPPool

BUILTIN_ENVIRONMENTS: dict[str, str] = {
    "mcp": "thermik.envs.mcp_tool_env:MCPToolEnv",
}
"""The envs of this package; the built-in tasks' envs are in thermik.tasks.registry.TASKS."""
SKYRL_GYM_PREFIX = "skyrl_gym:"
"""`skyrl_gym:<name>` runs skyrl-gym environment <name> unchanged (thermik.envs.skyrl_gym_env)."""
PREFIXED_SOURCES: dict[str, str] = {
    SKYRL_GYM_PREFIX: "thermik.envs.skyrl_gym_env:skyrl_gym_env_class",
    "reasoning_gym:": "thermik.envs.reasoning_gym_env:reasoning_gym_env_class",
    "openenv:": "thermik.envs.openenv_env:openenv_env_class",
    "openenv+ws://": "thermik.envs.openenv_env:remote_env_class",
    "openenv+wss://": "thermik.envs.openenv_env:secure_env_class",
    "verifiers:": "thermik.envs.verifiers_env:verifiers_env_class",
}
"""Environment ecosystems by name prefix -> "pkg.mod:function" returning the Env class for the rest of the name
(imported on first use, so an ecosystem's package is needed only when a run names it)."""

ENVIRONMENTS: dict[str, str] = dict(BUILTIN_ENVIRONMENTS)
"""name -> "pkg.mod:Class"; the built-ins plus whatever `register` added."""


class UnknownEnvError(ThermikError, ValueError):
    """An env name that no table knows: the message lists the names (and the closest one) to pass to --env.name."""

    def __init__(self, name: str, names: list[str], what: str = "environment") -> None:
        close = difflib.get_close_matches(name, names, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        others = ", ".join(p + "<name>" for p in PREFIXED_SOURCES)
        super().__init__(
            f"unknown {what} {name!r}{guess}; --env.name takes one of {', '.join(sorted(names))}, {others} "
            "or a 'pkg.mod:Class' path"
        )


def register(name: str, entry_point: str) -> None:
    """Add a user environment under `name`; a name already taken is an error, never overwritten."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"environment name must be a non-empty string without ':', got {name!r}")
    if name in ENVIRONMENTS:
        raise ValueError(f"environment {name!r} is already registered (as {ENVIRONMENTS[name]!r})")
    _split_entry_point(entry_point)
    ENVIRONMENTS[name] = entry_point


def unregister(name: str) -> None:
    """Remove a user environment (built-ins stay); mainly for tests."""
    if name in BUILTIN_ENVIRONMENTS:
        raise ValueError(f"cannot unregister built-in environment {name!r}")
    ENVIRONMENTS.pop(name, None)


def resolve(name_or_path: str, builtins: Mapping[str, str] | None = None) -> type[Env]:
    """The Env class for a registered name, a prefixed ecosystem name (`skyrl_gym:<name>`, ...), or 'pkg.mod:Class'.

    `builtins`: further built-in names -> "pkg.mod:Class" (thermik.tasks passes its table), looked up first;
    a name both there and registered with `register` is an error.
    """
    for prefix, factory in PREFIXED_SOURCES.items():
        if name_or_path.startswith(prefix):
            module_name, attr = _split_entry_point(factory)
            return getattr(importlib.import_module(module_name), attr)(name_or_path.removeprefix(prefix))
    entry_point = _lookup(name_or_path, builtins or {})
    if entry_point is None:
        if ":" not in name_or_path:
            raise UnknownEnvError(name_or_path, known_names(builtins))
        entry_point = name_or_path
    module_name, attr = _split_entry_point(entry_point)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"environment {name_or_path!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"environment {name_or_path!r}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ValueError(f"environment {name_or_path!r}: {entry_point!r} is not a subclass of thermik.envs.base.Env")
    return cls


def make(
    name_or_path: str,
    *,
    reward_spec: dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    options: EnvConfig | None = None,
    pool: MCPPool | None = None,
    builtins: Mapping[str, str] | None = None,
) -> Env:
    """Build the environment for one dataset row; `pool` goes to the envs that set `uses_mcp_pool`."""
    cls = resolve(name_or_path, builtins)
    extra_info, options = extra_info or {}, options or EnvConfig()
    if not cls.uses_mcp_pool:
        return cls(reward_spec=reward_spec, extra_info=extra_info, options=options)
    if pool is None:
        raise ValueError(f"environment {name_or_path!r} calls MCP servers: build it with a pool (make(..., pool=))")
    return cls(reward_spec=reward_spec, extra_info=extra_info, options=options, pool=pool)


def known_names(builtins: Mapping[str, str] | None = None) -> list[str]:
    """Every env name `resolve` takes without a prefix: the registered ones and `builtins`."""
    return sorted({*ENVIRONMENTS, *(builtins or {})})


def _lookup(name: str, builtins: Mapping[str, str]) -> str | None:
    if name in builtins and name in ENVIRONMENTS:
        raise ValueError(f"environment {name!r} is built in and also registered (as {ENVIRONMENTS[name]!r})")
    return builtins.get(name) or ENVIRONMENTS.get(name)


def _split_entry_point(entry_point: str) -> tuple[str, str]:
    module_name, sep, attr = entry_point.partition(":") if isinstance(entry_point, str) else ("", "", "")
    if not sep or not module_name or not attr or ":" in attr:
        raise ValueError(f"entry point must look like 'pkg.mod:Class', got {entry_point!r}")
    return module_name, attr

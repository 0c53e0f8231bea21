"""The built-in tasks: one explicit table of name -> env entry point + row generator (+ LLM generator).

`make_env` turns any env name into an env: a built-in task here first, then what thermik.envs.registry
knows (`mcp`, user `register` calls, `skyrl_gym:<name>`, 'pkg.mod:Class' paths). `generate_rows` and
`solve` are the synthetic rows of a task and their solved conversations (for SFT and tests). Train and
eval problems are disjoint by construction (thermik.data.split). An unknown name is answered with the
valid ones.
"""

from __future__ import annotations

import functools
import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thermik.config.schema import EnvConfig, LLMGeneratorConfig
from thermik.data.llm_generate import LLMTask, generate_with_llm
from thermik.data.split import Split, draw_problems
from thermik.envs import registry as env_registry
from thermik.envs.base import Env, Message
from thermik.errors import ThermikError
from thermik.tasks.calculator.generate import (
    calculator_problem,
    calculator_row,
    calculator_solve,
    calculator_solve_thinking,
    calculator_thinking_row,
)
from thermik.tasks.code.generate import code_problem, code_row, code_solve
from thermik.tasks.gsm8k.generate import math_problem, math_row, math_solve
from thermik.tasks.gsm8k.llm import math_llm_task
from thermik.tasks.reverse_text.generate import reverse_problem, reverse_row, reverse_solve
from thermik.tasks.search.generate import search_problem, search_row, search_solve
from thermik.tasks.text2sql.generate import sql_problem, sql_row, sql_solve
from thermik.tasks.text2sql.llm import SQL_LLM_TASK
from thermik.tasks.word_problems.generate import word_row
from thermik.tools.mcp_pool import MCPPool


@dataclass(frozen=True)
class Generator:
    """problem: rng -> problem text (the split key); row: text -> dataset row; solve: row -> full conversation."""

    problem: Callable[[random.Random], str]
    row: Callable[[str], dict[str, Any]]
    solve: Callable[[dict[str, Any]], list[Message]]


@dataclass(frozen=True)
class Task:
    """A built-in task: its env ("pkg.mod:Class", imported on first use; None when the env is not thermik's own),
    its rule-based row generator, and the LLM generator of new rows, when it has one."""

    env: str | None
    generator: Generator
    llm: LLMTask | None = None


TASKS: dict[str, Task] = {
    "calculator": Task(
        "thermik.tasks.calculator.env:CalculatorEnv", Generator(calculator_problem, calculator_row, calculator_solve)
    ),
    # The calculator solved as a Qwen3-style thinking model writes it (examples/thinking_calculator).
    "calculator_thinking": Task(
        "thermik.tasks.calculator.env:CalculatorEnv",
        Generator(calculator_problem, calculator_thinking_row, calculator_solve_thinking),
    ),
    # Word problems answered through the calculator tool: the calculator env reads their rows as they are.
    "word_problems": Task(
        "thermik.tasks.calculator.env:CalculatorEnv", Generator(math_problem, word_row, calculator_solve)
    ),
    "reverse_text": Task(
        "thermik.tasks.reverse_text.env:ReverseTextEnv", Generator(reverse_problem, reverse_row, reverse_solve)
    ),
    "gsm8k": Task(
        "thermik.tasks.gsm8k.env:GSM8KEnv",
        Generator(math_problem, functools.partial(math_row, "gsm8k"), math_solve),
        math_llm_task("gsm8k"),
    ),
    "math_feedback": Task(
        "thermik.tasks.math_feedback.env:MathFeedbackEnv",
        Generator(math_problem, functools.partial(math_row, "math_feedback"), math_solve),
        math_llm_task("math_feedback"),
    ),
    # skyrl-gym's gsm8k reads the same rows (reward_spec.ground_truth, a numeric string); its env is skyrl-gym's.
    "skyrl_gym:gsm8k": Task(None, Generator(math_problem, functools.partial(math_row, "skyrl_gym:gsm8k"), math_solve)),
    "text2sql": Task(
        "thermik.tasks.text2sql.env:Text2SQLEnv", Generator(sql_problem, sql_row, sql_solve), SQL_LLM_TASK
    ),
    "search": Task("thermik.tasks.search.env:SearchEnv", Generator(search_problem, search_row, search_solve)),
    "code": Task("thermik.tasks.code.env:CodeEnv", Generator(code_problem, code_row, code_solve)),
}
ROWS_MODULES: dict[str, str] = {"repo_repair": "thermik.tasks.repo_repair.generate"}
"""Built-in tasks whose rows come from a module (`check`, `rows`, `solve`, as PREFIXED_GENERATORS'), by name."""
TASK_ENVS: dict[str, str] = {name: task.env for name, task in TASKS.items() if task.env is not None}
TASK_ENVS["repo_repair"] = "thermik.tasks.repo_repair.env:RepoRepairEnv"
"""The built-in env names -> "pkg.mod:Class", handed to thermik.envs.registry."""
GENERATORS: dict[str, Generator] = {name: task.generator for name, task in TASKS.items()}
PREFIXED_GENERATORS: dict[str, str] = {
    "reasoning_gym:": "thermik.tasks.reasoning_gym_rows",
    "openenv:": "thermik.tasks.openenv_rows",
    "openenv+ws://": "thermik.tasks.openenv_rows",
    "openenv+wss://": "thermik.tasks.openenv_rows",
    "verifiers:": "thermik.tasks.verifiers_rows",
}
"""Environment ecosystems by name prefix -> the module of their rows: `check(env)`, `rows(env, n, seed, split,
options)` and `solve(row, options)` (imported on first use)."""


def make_env(
    name_or_path: str,
    *,
    reward_spec: dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    options: EnvConfig | None = None,
    pool: MCPPool | None = None,
) -> Env:
    """The env for one dataset row: a built-in task's, else any env thermik.envs.registry.make resolves.

    `pool` (the run's MCPPool) is passed to the envs that call MCP servers, and required by them.
    """
    return env_registry.make(
        name_or_path, reward_spec=reward_spec, extra_info=extra_info, options=options, pool=pool, builtins=TASK_ENVS
    )


def register(name: str, entry_point: str) -> None:
    """Add a user environment (thermik.envs.registry.register); a built-in task's name is refused too."""
    if name in TASK_ENVS:
        raise ValueError(f"environment {name!r} is already registered (as {TASK_ENVS[name]!r})")
    env_registry.register(name, entry_point)


def unregister(name: str) -> None:
    """Remove a user environment (thermik.envs.registry.unregister); built-in tasks stay."""
    if name in TASK_ENVS:
        raise ValueError(f"cannot unregister built-in environment {name!r}")
    env_registry.unregister(name)


class NoGeneratorError(ThermikError, ValueError):
    """A known env that writes no problems of its own: its rows come from a dataset file."""


def _generator(env: str) -> Generator:
    if env in GENERATORS:
        return GENERATORS[env]
    known = env_registry.known_names(TASK_ENVS)
    if env not in known and ":" not in env:
        raise env_registry.UnknownEnvError(env, known)
    raise NoGeneratorError(
        f"environment {env!r} has no problem generator (generators: {', '.join(sorted([*GENERATORS, *ROWS_MODULES]))}"
        "); give its "
        "rows in a dataset file: --data.train_path / --data.eval_path (thermik sft: --eval_path)"
    )


def _prefixed(env: str) -> Any:
    """The rows module of an ecosystem's env name (or of a task in ROWS_MODULES); None for other names."""
    if env in ROWS_MODULES:
        return importlib.import_module(ROWS_MODULES[env])
    for prefix, module in PREFIXED_GENERATORS.items():
        if env.startswith(prefix):
            return importlib.import_module(module)
    return None


def check_generator(env: str) -> None:
    """Raise when `env` has no row generator (the error lists the valid names, or an ecosystem's valid names)."""
    prefixed = _prefixed(env)
    if prefixed is None:
        _generator(env)
    else:
        prefixed.check(env)


def generate_rows(
    env: str, n: int, seed: int, split: Split = "train", options: EnvConfig | None = None
) -> list[dict[str, Any]]:
    """`n` distinct problems of `env` from `split`, deterministic in (env, n, seed, split); `options` configures an
    ecosystem's rows (e.g. env.reasoning_gym)."""
    prefixed = _prefixed(env)
    if prefixed is not None:
        return prefixed.rows(env, n, seed, split, options or EnvConfig(name=env))
    generator = _generator(env)
    return [generator.row(problem) for problem in draw_problems(generator.problem, env, n, seed, split)]


def solve(row: dict[str, Any], options: EnvConfig | None = None) -> list[Message]:
    """The full solved conversation: the prompt, then the exact assistant text (and tool results) that earn reward 1
    (for a reasoning-gym row: the task's own answer, which scores below 1 where the task accepts several)."""
    prefixed = _prefixed(row["env_class"])
    if prefixed is not None:
        return prefixed.solve(row, options or EnvConfig(name=row["env_class"]))
    return _generator(row["env_class"]).solve(row)


def llm_generate_rows(
    env: str, n: int, cfg: LLMGeneratorConfig, seed: int = 0, split: str = "train"
) -> list[dict[str, Any]]:
    """`n` distinct checked rows of `split` of `env`, written by the model behind `cfg` (thermik.data.llm_generate)."""
    llm_tasks = {name: task.llm for name, task in TASKS.items() if task.llm is not None}
    if env not in llm_tasks:
        raise ValueError(f"no LLM generator for environment {env!r}; valid: {', '.join(sorted(llm_tasks))}")
    return generate_with_llm(llm_tasks[env], n, cfg, seed=seed, split=split)

"""Write a Python function that passes hidden unit tests, run in the `python_sandbox` MCP server.

The model may call `run_python(code, timeout_s)` to try things, and ends with its solution in a fenced
```python block (the last one counts). The env runs the solution and the hidden tests (assert
statements) in the sandbox; a random per-episode marker on the harness's report line keeps the solution
from printing a fake score. Reward: the fraction of tests passed (reward_spec "scoring": "fraction",
the default) or 1.0 only when all pass ("all"). A solution that fails to load, times out or crashes
the sandbox scores 0.

reward_spec: {"ground_truth": {"entry_point": "f", "tests": ["assert f(1) == 2", ...]}, "scoring": ...}.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.tool_use import ServerTools, function_schema
from thermik.tasks.code import server as python_sandbox
from thermik.tools.mcp_pool import MCPPool

RUN_PYTHON_TOOL = function_schema(
    python_sandbox.TOOL_NAME,
    "Run Python code in a sandbox; returns exit code, stdout and stderr.",
    {"code": {"type": "string"}, "timeout_s": {"type": "number"}},
    ["code"],
)
SCORINGS = ("fraction", "all")
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)

# The harness keeps its own references to exec/print before the solution runs, loads the solution in its own
# namespace, runs each test there and reports "<marker> passed/total" on stdout.
_HARNESS = """\
import builtins as _b
_exec, _print, _repr = _b.exec, _b.print, _b.repr
_namespace = {{"__name__": "solution"}}
_passed = 0
try:
    _exec({solution!r}, _namespace)
    _loaded = True
except BaseException as _exc:
    _loaded = False
    _print("solution failed to load:", _repr(_exc))
for _test in {tests!r}:
    if not _loaded:
        break
    try:
        _exec(_test, _namespace)
        _passed += 1
    except BaseException as _exc:
        _print("failed:", _test, "->", _repr(_exc)[:200])
_print("{marker}", str(_passed) + "/" + str({total}))
"""


def extract_code(action: str) -> str | None:
    """The last fenced ```python block, or None."""
    blocks = _CODE_BLOCK.findall(action)
    return blocks[-1] if blocks else None


def harness(solution: str, tests: list[str], marker: str) -> str:
    return _HARNESS.format(solution=solution, tests=tests, marker=marker, total=len(tests))


class CodeEnv(Env):
    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        truth = reward_spec.get("ground_truth")
        tests = truth.get("tests") if isinstance(truth, dict) else None
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"code: reward_spec['ground_truth']['tests'] must list test strings, got {truth!r}")
        scoring = reward_spec.get("scoring", "fraction")
        if scoring not in SCORINGS:
            raise ValueError(f"code: reward_spec['scoring'] must be one of {SCORINGS}, got {scoring!r}")
        self.tests, self.scoring = tests, scoring
        self.tools = [RUN_PYTHON_TOOL]
        self.server = ServerTools(python_sandbox.server_spec(), self.tools, options, pool)
        self.extra_info = extra_info

    def step(self, action: str) -> StepOutput:
        raise TypeError("CodeEnv calls an MCP server asynchronously: use `await env.astep(action)`")

    async def astep(self, action: str) -> StepOutput:
        turn = await self.server.run_turn(action)
        metrics = turn.metrics()
        if turn.found:
            return StepOutput(turn.observations, 0.0, False, metrics)
        solution = extract_code(action)
        if solution is None:
            return StepOutput([], 0.0, True, metrics)
        passed = await self._run_tests(solution)
        fraction = passed / len(self.tests)
        reward = fraction if self.scoring == "fraction" else float(passed == len(self.tests))
        return StepOutput([], reward, True, {**metrics, "tests_passed": passed, "tests_total": len(self.tests)})

    async def _run_tests(self, solution: str) -> int:
        marker = f"THERMIK-TESTS-{secrets.token_hex(8)}"
        result = await self.server.call(python_sandbox.TOOL_NAME, {"code": harness(solution, self.tests, marker)})
        found = re.findall(rf"^{marker} (\d+)/\d+$", result.text, re.MULTILINE)
        return min(int(found[-1]), len(self.tests)) if found and not result.is_error else 0

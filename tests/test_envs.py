"""Environment registry, reverse_text rewards, and calculator episodes through the real MCP server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psutil
import pytest

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.registry import ENVIRONMENTS, resolve
from thermik.tasks.calculator.env import CALCULATE_SCHEMA, CalculatorEnv
from thermik.tasks.registry import generate_rows, register, solve, unregister
from thermik.tasks.registry import make_env as make
from thermik.tasks.reverse_text.env import ReverseTextEnv, reversal_reward
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call


class _EchoEnv(Env):
    def __init__(self, *, reward_spec, extra_info, options) -> None:
        self.reward_spec = reward_spec

    def step(self, action: str) -> StepOutput:
        return StepOutput([], 1.0, True)


class _NotAnEnv:
    pass


@pytest.fixture(scope="module")
def pool() -> MCPPool:
    """One pool for the module, so its tests share one calculator server (closed with the runner)."""
    return MCPPool()


@pytest.fixture(scope="module")
def runner(pool: MCPPool) -> Iterator[asyncio.Runner]:
    """One event loop for the module."""
    with asyncio.Runner() as r:
        yield r
        r.run(pool.aclose())


# ---------------------------------------------------------------- registry


def test_make_builtins_by_name_and_path(pool):
    env = make("reverse_text", reward_spec={"ground_truth": "cba"})
    assert isinstance(env, ReverseTextEnv)
    path = "thermik.tasks.calculator.env:CalculatorEnv"
    env = make(path, reward_spec={"ground_truth": 3}, options=EnvConfig(), pool=pool)
    assert isinstance(env, CalculatorEnv) and env.tool_server.pool is pool


def test_make_mcp_env_without_pool_is_an_error():
    with pytest.raises(ValueError, match="calls MCP servers"):
        make("calculator", reward_spec={"ground_truth": 3})


def test_make_unknown_name_lists_valid_names():
    with pytest.raises(
        ValueError,
        match=r"unknown environment .nope.*calculator, calculator_thinking, code, gsm8k, math_feedback, mcp, "
        r"repo_repair, reverse_text, search, text2sql",
    ):
        make("nope", reward_spec={})


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_such_module_xyz:Env", "cannot import module"),
        ("thermik.envs.base:Missing", "has no attribute 'Missing'"),
        (f"{__name__}:_NotAnEnv", "not a subclass"),
    ],
)
def test_resolve_bad_paths(path, fragment):
    with pytest.raises(ValueError, match=fragment):
        resolve(path)


def test_register_user_env_and_reject_duplicates():
    register("echo_test", f"{__name__}:_EchoEnv")
    try:
        env = make("echo_test", reward_spec={"x": 1})
        assert isinstance(env, _EchoEnv) and env.reward_spec == {"x": 1}
        with pytest.raises(ValueError, match="already registered"):
            register("echo_test", f"{__name__}:_EchoEnv")
        with pytest.raises(ValueError, match="already registered"):
            register("calculator", f"{__name__}:_EchoEnv")
    finally:
        unregister("echo_test")
    assert "echo_test" not in ENVIRONMENTS
    with pytest.raises(ValueError, match="cannot unregister built-in"):
        unregister("calculator")
    with pytest.raises(ValueError, match=r"pkg\.mod:Class"):
        register("bad_entry", "not_a_path")


# ---------------------------------------------------------------- reverse_text


@pytest.mark.parametrize(
    ("action", "truth", "expected"),
    [
        ("<reversed>olleh</reversed>", "olleh", 1.0),
        ("sure: <reversed> olleh </reversed> done", "olleh", 1.0),
        ("olleh", "olleh", 0.0),  # no tags
        ("<reversed>olleh", "olleh", 0.0),  # no close tag
        ("<reversed>olle</reversed>", "olleh", 8 / 9),  # 4 matching chars: 2*4/(4+5)
        ("<reversed>xyz</reversed>", "olleh", 0.0),
        ("<reversed>ollehxxxxx</reversed>", "olleh", 2 * 5 / 15),
        ("<reversed></reversed>", "olleh", 0.0),
        ("<reversed>ba</reversed><reversed>olleh</reversed>", "olleh", 0.0),  # first tag counts
    ],
)
def test_reversal_reward_hand_values(action, truth, expected):
    assert reversal_reward(action, truth) == pytest.approx(expected)


def test_reverse_text_env_single_step():
    env = make("reverse_text", reward_spec={"ground_truth": "dlrow"})
    prompt = [{"role": "user", "content": "world"}]
    assert env.init(prompt) == (prompt, {})
    out = env.step("<reversed>dlrow</reversed>")
    assert (out.reward, out.done, out.observations) == (1.0, True, [])


def test_reverse_text_rejects_bad_ground_truth():
    with pytest.raises(ValueError, match="ground_truth"):
        make("reverse_text", reward_spec={"ground_truth": 5})


# ---------------------------------------------------------------- calculator (real MCP server)


def _calc(pool: MCPPool, truth, **options) -> CalculatorEnv:
    spec = {"method": "rule", "ground_truth": truth}
    env = make("calculator", reward_spec=spec, options=EnvConfig(**options), pool=pool)
    assert isinstance(env, CalculatorEnv)
    return env


def _call(expression: str, name: str = "calculate") -> str:
    return format_hermes_tool_call(name, {"expression": expression})


def test_calculator_correct_solve_gets_one(runner, pool):
    env = _calc(pool, 338)
    assert env.tools == [CALCULATE_SCHEMA] and CALCULATE_SCHEMA["function"]["name"] == "calculate"
    first = runner.run(env.astep(_call("23 + 45 * 7")))
    assert first.observations == [{"role": "tool", "name": "calculate", "content": "338"}]
    assert (first.reward, first.done, first.metadata) == (0.0, False, {"tool_calls": 1, "tool_failures": 0})
    last = runner.run(env.astep("<answer>338</answer>"))
    assert (last.reward, last.done, last.observations) == (1.0, True, [])
    assert env.num_tool_calls == 1


@pytest.mark.parametrize(("answer", "reward"), [("337", 0.0), ("338.0", 1.0), (" 338 ", 1.0), ("abc", 0.0)])
def test_calculator_answer_is_compared_numerically(runner, pool, answer, reward):
    out = runner.run(_calc(pool, "338").astep(f"<answer>{answer}</answer>"))
    assert (out.reward, out.done) == (reward, True)


def test_calculator_malformed_and_unknown_tool_calls_are_error_observations(runner, pool):
    env = _calc(pool, 3)
    bad = runner.run(env.astep('<tool_call>{"name": "calculate", "arguments": {</tool_call>'))
    assert not bad.done and bad.reward == 0.0
    assert len(bad.observations) == 1 and bad.observations[0]["content"].startswith("error: invalid JSON")
    unknown = runner.run(env.astep(_call("1+2", name="search")))
    assert unknown.observations[0]["content"].startswith("error: unknown tool 'search'")
    tool_error = runner.run(env.astep(_call("1/0")))
    assert tool_error.observations == [{"role": "tool", "name": "calculate", "content": "error: division by zero"}]
    assert [o.metadata["tool_failures"] for o in (bad, unknown, tool_error)] == [1, 1, 1]
    assert (env.num_tool_calls, env.num_tool_failures) == (3, 3)


def test_calculator_turn_without_answer_or_call_ends_with_zero(runner, pool):
    out = runner.run(_calc(pool, 3).astep("I think it is 3."))
    assert (out.reward, out.done, out.observations) == (0.0, True, [])


def test_calculator_sync_step_points_to_astep(pool):
    with pytest.raises(TypeError, match="astep"):
        _calc(pool, 1).step("<answer>1</answer>")


def test_calculator_tool_timeout_is_an_error_observation_not_a_hang(runner, pool):
    env = _calc(pool, 2, tool_latency_s=2.0, tool_timeout_s=0.3)

    async def timed():
        return await asyncio.wait_for(env.astep(_call("1 + 1")), 15.0)

    out = runner.run(timed())
    assert not out.done
    assert out.observations[0]["content"].startswith("error:") and "timed out" in out.observations[0]["content"]
    assert out.metadata == {"tool_calls": 1, "tool_failures": 1}


def test_calculator_rejects_non_numeric_ground_truth(pool):
    with pytest.raises(ValueError, match="ground_truth"):
        _calc(pool, "many")


# ---------------------------------------------------------------- replay of synthetic solutions


async def _replay(row: dict, pool: MCPPool) -> tuple[float, bool]:
    """Feed the solver's assistant turns to the env; the env's observations must equal the solver's tool turns."""
    spec, extra_info = row["reward_spec"], row["extra_info"]
    env = make(row["env_class"], reward_spec=spec, extra_info=extra_info, options=EnvConfig(), pool=pool)
    conversation = solve(row)
    messages, _ = await env.ainit(row["prompt"])
    assert conversation[: len(messages)] == messages
    rest, total = conversation[len(messages) :], 0.0
    i = 0
    while i < len(rest):
        assert rest[i]["role"] == "assistant"
        out = await env.astep(rest[i]["content"])
        total += out.reward
        i += 1
        expected = []
        while i < len(rest) and rest[i]["role"] == "tool":
            expected.append(rest[i])
            i += 1
        assert out.observations == expected
        if out.done:
            return total, i == len(rest)
    return total, False


@pytest.mark.parametrize(("env_name", "n"), [("calculator", 20), ("reverse_text", 100)])
def test_solved_synthetic_rows_replay_to_reward_one(runner, pool, env_name, n):
    rows = generate_rows(env_name, n, seed=3, split="train") + generate_rows(env_name, 5, seed=3, split="eval")

    async def replay_all():
        return await asyncio.gather(*(_replay(row, pool) for row in rows))

    assert runner.run(replay_all()) == [(1.0, True)] * len(rows)


def _live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != "zombie"}


def test_env_server_is_reaped_by_closing_the_pool():
    before = _live_children()  # the module runner's servers are still up
    own = MCPPool()
    with asyncio.Runner() as r:
        r.run(_calc(own, 2).astep(_call("1+1")))
        assert len(_live_children() - before) == 1
        r.run(own.aclose())
    assert _live_children() - before == set()

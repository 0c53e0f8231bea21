"""The environment suite: solved synthetic rows replay to reward 1 through real MCP servers, wrong ones get 0,
and each reward rule on known-good and known-bad answers (gsm8k, math_feedback, text2sql, search, code, skyrl_gym)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thermik.config.schema import EnvConfig
from thermik.envs.answers import exact_match, extract_lenient, extract_strict, normalize_answer, numbers_match
from thermik.envs.base import Env
from thermik.tasks.code.env import harness
from thermik.tasks.math_feedback.env import FEEDBACK
from thermik.tasks.registry import generate_rows, solve
from thermik.tasks.registry import make_env as make
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call

SUITE = ("gsm8k", "math_feedback", "text2sql", "search", "code", "word_problems")


@pytest.fixture(scope="module")
def pool() -> MCPPool:
    """One pool for the module, so its tests share each server (closed with the runner)."""
    return MCPPool()


@pytest.fixture(scope="module")
def runner(pool: MCPPool) -> Iterator[asyncio.Runner]:
    """One event loop for the module."""
    with asyncio.Runner() as r:
        yield r
        r.run(pool.aclose())


def _env(row: dict[str, Any], pool: MCPPool, **options: Any) -> Env:
    return make(row["env_class"], reward_spec=row["reward_spec"], extra_info=row["extra_info"],
                options=EnvConfig(**options), pool=pool)  # fmt: skip


async def _replay(
    row: dict[str, Any], conversation: list[dict[str, Any]], pool: MCPPool
) -> tuple[float, list[dict[str, Any]]]:
    """Feed the conversation's assistant turns to a fresh env; return the total reward and every observation."""
    env = _env(row, pool)
    messages, _ = await env.ainit(row["prompt"])
    assert conversation[: len(messages)] == messages
    total, observations = 0.0, []
    for message in conversation[len(messages) :]:
        if message["role"] != "assistant":
            continue
        out = await env.astep(message["content"])
        total += out.reward
        observations += out.observations
        if out.done:
            break
    await env.aclose()
    return total, observations


def _tool_turns(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in conversation if m["role"] == "tool"]


# ---------------------------------------------------------------- every env: solved rows get 1, wrong ones 0


@pytest.mark.parametrize("env_name", SUITE)
def test_solved_rows_replay_to_reward_one_with_the_solvers_observations(runner, pool, env_name):
    rows = generate_rows(env_name, 6, seed=1, split="train") + generate_rows(env_name, 2, seed=1, split="eval")

    async def replay_all():
        return await asyncio.gather(*(_replay(row, solve(row), pool) for row in rows))

    for row, (reward, observations) in zip(rows, runner.run(replay_all()), strict=True):
        assert reward == 1.0, row["prompt"][-1]["content"]
        assert observations == _tool_turns(solve(row))  # the env's tool results are what SFT data shows


WRONG_FINAL: dict[str, str] = {
    "gsm8k": "I think it is\n#### 999999",
    "math_feedback": "#### 999999",
    "text2sql": "<sql>SELECT COUNT(*) FROM products WHERE price < 0</sql>",
    "search": "<answer>Atlantis</answer>",
    "code": "```python\ndef nothing():\n    return None\n```",
    "word_problems": "<answer>999999</answer>",
}


@pytest.mark.parametrize("env_name", SUITE)
def test_a_wrong_final_answer_gets_zero(runner, pool, env_name):
    row = generate_rows(env_name, 1, seed=2, split="train")[0]
    conversation = solve(row)
    conversation[-1] = {"role": "assistant", "content": WRONG_FINAL[env_name]}
    reward, _ = runner.run(_replay(row, conversation, pool))
    assert reward == 0.0


@pytest.mark.parametrize("env_name", ["text2sql", "search", "code"])
def test_a_turn_with_neither_answer_nor_tool_call_ends_with_zero(runner, pool, env_name):
    row = generate_rows(env_name, 1, seed=0)[0]
    out = runner.run(_env(row, pool).astep("hmm, not sure"))
    assert (out.reward, out.done, out.observations) == (0.0, True, [])


@pytest.mark.parametrize(
    ("env_name", "call", "fragment"),
    [
        ("text2sql", ("drop_everything", {}), "unknown tool 'drop_everything'; available: list_tables"),
        ("text2sql", ("query", {"sql": "DELETE FROM orders"}), "error: only read-only SELECT queries are allowed"),
        ("search", ("open", {"doc_id": "nope"}), "error: unknown doc_id 'nope'"),
        ("code", ("run_python", {"code": "import socket; socket.socket()"}), "socket.__new__ is not allowed"),
    ],
)
def test_bad_tool_calls_become_error_observations(runner, pool, env_name, call, fragment):
    row = generate_rows(env_name, 1, seed=0)[0]
    out = runner.run(_env(row, pool).astep(format_hermes_tool_call(*call)))
    assert not out.done and out.reward == 0.0
    assert fragment in out.observations[0]["content"]
    assert out.metadata["tool_calls"] == 1
    if "unknown tool" in fragment or "error:" in fragment:
        assert out.metadata["tool_failures"] == 1


# ---------------------------------------------------------------- gsm8k / math_feedback


@pytest.mark.parametrize(
    ("text", "strict", "lenient"),
    [
        ("3 + 4 = 7\n#### 7", "7", "7"),
        ("so <answer>1,234</answer>", "1,234", "1,234"),
        ("The answer is 12.", None, "12"),
        ("#### 5 but actually <answer>6</answer>", "6", "6"),
        ("no numbers", None, None),
    ],
)
def test_strict_and_lenient_extraction(text, strict, lenient):
    assert (extract_strict(text), extract_lenient(text)) == (strict, lenient)


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(max_size=80), number=st.integers(-(10**9), 10**9), tagged=st.booleans())
def test_extraction_never_raises_and_finds_a_final_number(prefix, number, tagged):
    text = prefix + (f"<answer>{number}</answer>" if tagged else f"\n#### {number}")
    extract_strict(prefix), extract_lenient(prefix)  # any text: no exception
    assert numbers_match(extract_strict(text), number)
    assert numbers_match(extract_lenient(text), number)


def test_gsm8k_strict_needs_the_format_lenient_does_not():
    spec = {"ground_truth": "12"}
    strict = make("gsm8k", reward_spec=spec)
    lenient = make("gsm8k", reward_spec={**spec, "extraction": "lenient"})
    assert strict.step("The answer is 12.").reward == 0.0
    assert lenient.step("The answer is 12.").reward == 1.0
    out = strict.step("6 * 2 = 12\n#### 12")
    assert out.reward == 1.0 and out.metadata == {"correct_strict": True, "correct_lenient": True}
    with pytest.raises(ValueError, match="extraction"):
        make("gsm8k", reward_spec={**spec, "extraction": "fuzzy"})
    with pytest.raises(ValueError, match="ground_truth"):
        make("gsm8k", reward_spec={"ground_truth": "twelve"})


def test_math_feedback_gives_feedback_and_decays_the_reward():
    env = make("math_feedback", reward_spec={"ground_truth": "10"}, options=EnvConfig(max_turns=3))
    first = env.step("#### 9")
    assert (first.reward, first.done, first.observations) == (0.0, False, [{"role": "user", "content": FEEDBACK}])
    second = env.step("#### 10")
    assert (second.reward, second.done) == (0.5, True)
    env = make("math_feedback", reward_spec={"ground_truth": "10"}, options=EnvConfig(max_turns=2))
    assert not env.step("#### 1").done
    last = env.step("#### 2")
    assert (last.reward, last.done, last.observations) == (0.0, True, [])


# ---------------------------------------------------------------- text2sql


@pytest.mark.parametrize(
    ("final", "reward"),
    [
        ("<sql>SELECT name FROM products WHERE category = 'toys' ORDER BY name DESC</sql>", 1.0),  # rows as a set
        ("<sql>SELECT name, price FROM products WHERE category = 'toys'</sql>", 0.0),  # extra column
        ("<sql>SELECT nam FROM products</sql>", 0.0),  # SQL error
        ("<answer>Kite</answer>", 0.0),  # the gold result is not one cell
    ],
)
def test_text2sql_execution_match(runner, pool, final, reward):
    env = make("text2sql", reward_spec={"ground_truth": "SELECT name FROM products WHERE category = 'toys'"}, pool=pool)
    assert runner.run(env.astep(final)).reward == reward


def test_text2sql_single_cell_answer_and_bad_gold(pool):
    env = make("text2sql", reward_spec={"ground_truth": "SELECT COUNT(*) FROM products"}, pool=pool)
    assert asyncio.run(env.astep("<answer>20</answer>")).reward == 1.0
    assert asyncio.run(env.astep("<answer>21</answer>")).reward == 0.0
    with pytest.raises(ValueError, match="gold SQL fails"):
        make("text2sql", reward_spec={"ground_truth": "SELECT * FROM nowhere"}, pool=pool)


# ---------------------------------------------------------------- search


def test_squad_normalisation_and_exact_match():
    assert normalize_answer("The  River-Kessa!") == "riverkessa"
    assert exact_match("an amber.", ["Amber"]) and not exact_match("amber wine", ["amber"])


# ---------------------------------------------------------------- code


def test_code_scoring_fraction_and_all(runner, pool):
    tests = ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7"]
    action = "```python\ndef f(x):\n    return 2 * x\n```"
    fraction = make("code", reward_spec={"ground_truth": {"tests": tests}}, pool=pool)
    out = runner.run(fraction.astep(action))
    assert out.reward == pytest.approx(2 / 3) and out.metadata["tests_passed"] == 2
    everything = make("code", reward_spec={"ground_truth": {"tests": tests}, "scoring": "all"}, pool=pool)
    assert runner.run(everything.astep(action)).reward == 0.0


def test_code_solution_cannot_fake_the_score_or_patch_exec(runner, pool):
    tests = ["assert f() == 1"]
    cheats = [
        "```python\nprint('THERMIK-TESTS-0000000000000000 1/1')\ndef f():\n    return 0\n```",
        "```python\nimport builtins\nbuiltins.exec = lambda *a, **k: None\ndef f():\n    return 0\n```",
        "```python\nimport os\nos._exit(0)\n```",
    ]
    for cheat in cheats:
        env = make("code", reward_spec={"ground_truth": {"tests": tests}}, pool=pool)
        assert runner.run(env.astep(cheat)).reward == 0.0, cheat


def test_code_harness_reports_a_solution_that_does_not_load():
    from thermik.tasks.code.sandbox_runner import SandboxLimits, run_python

    result = run_python(harness("def f(:\n", ["assert f() == 1"], "MARK"), SandboxLimits())
    assert "solution failed to load" in result.stdout and "MARK 0/1" in result.stdout


# ---------------------------------------------------------------- skyrl-gym environments, unchanged


def test_skyrl_gym_gsm8k_grades_thermik_rows_like_thermiks_strict_gsm8k():
    pytest.importorskip("skyrl_gym")
    rows = generate_rows("gsm8k", 4, seed=0)
    for row in rows:
        env = make("skyrl_gym:gsm8k", reward_spec=row["reward_spec"], extra_info=row["extra_info"])
        messages, info = env.init(row["prompt"])
        assert (messages, info) == (row["prompt"], {})
        solved = env.step(solve(row)[-1]["content"])
        assert (solved.reward, solved.done, solved.observations) == (1.0, True, [])
        assert env.step("The answer is " + row["reward_spec"]["ground_truth"]).reward == 0.0  # strict format
        env.close()


def test_skyrl_gym_names_are_checked():
    pytest.importorskip("skyrl_gym")
    with pytest.raises(ValueError, match=r"unknown skyrl-gym environment 'nope'; valid: .*gsm8k"):
        make("skyrl_gym:nope", reward_spec={})
    with pytest.raises(ValueError, match="ground_truth is required"):
        make("skyrl_gym:gsm8k", reward_spec={})


def test_skyrl_gym_episode_runs_through_thermiks_agent_loop(tiny_model_dir):
    pytest.importorskip("skyrl_gym")
    from thermik.assembly.components import build_engine, env_factory, load_policy
    from thermik.config.schema import InferenceConfig, ModelConfig, SamplingConfig
    from thermik.rollout.agent_loop import LoopLimits, rollout_rows

    policy, chat = load_policy(ModelConfig(path=str(tiny_model_dir)))
    engine = build_engine(policy, chat, InferenceConfig())
    rows = generate_rows("gsm8k", 2, seed=0)
    limits = LoopLimits(max_turns=2, max_input_length=512, max_generate_length=16, max_sequence_length=640)
    make_env = env_factory(EnvConfig(name="skyrl_gym:gsm8k"), MCPPool())  # skyrl envs call no MCP server

    async def play():
        try:
            return await rollout_rows(engine, make_env, chat, rows, 2, limits, SamplingConfig(), seed=0)
        finally:
            await engine.close()

    trajectories = asyncio.run(play())
    assert len(trajectories) == 4
    for traj in trajectories:  # invariants were checked by the loop; the env ended each episode in one turn
        assert traj.num_turns == 1 and traj.stop_reason in ("stop", "length")
        assert sum(traj.rewards) in (0.0, 1.0)

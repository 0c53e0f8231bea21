"""MCPToolEnv: reward from ground truth (pure functions), limits, and whole episodes through the agent loop
against thermik's own MCP servers (real processes) plus local @tool functions."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from fixtures.faulty_server import SCRIPT
from fixtures.faulty_server import server_spec as faulty_server_spec
from test_rollout import ScriptedEngine

from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.envs.mcp_tool_env import MCPToolEnv, episode_reward, sequence_score, values_match
from thermik.envs.tool_use import ServerTools, function_schema
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits, run_episode
from thermik.tasks.registry import generate_rows, solve
from thermik.tasks.registry import make_env as make
from thermik.tools.local import ToolGroup
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import TOOL_CALL_FORMATTERS, ToolCall
from thermik.tools.toolbox import ToolLimitError

LOCAL_TOOLS = ToolGroup("local")


@LOCAL_TOOLS.tool
def shout(text: str) -> str:
    """Upper-case the text.

    Args:
        text: The text to shout.
    """
    return text.upper()


def faulty_entry(name: str = "faulty", *args: str, tools: list[str] | None = None) -> dict:
    """A row's server entry for the faulty test server (PYTHONPATH kept for a source checkout)."""
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return {"name": name, "command": sys.executable, "args": [SCRIPT, *args], "env": env, "tools": tools or []}


# ---------------------------------------------------------------- reward


def _calls(*pairs: tuple[str, dict]) -> list[ToolCall]:
    return [ToolCall(n, a) for n, a in pairs]


def test_sequence_score_in_order_with_partial_credit():
    expected = [{"tool": "a", "parameters": {"x": 1}}, {"tool": "b", "parameters": {}}, {"tool": "c"}]
    calls = _calls(("b", {}), ("a", {"x": "1.0", "y": 2}), ("b", {"z": 0}), ("a", {"x": 1}))
    assert sequence_score(expected, calls) == pytest.approx(2 / 3)  # a then b found in order, c missing
    assert sequence_score(expected, calls, all_or_nothing=True) == 0.0
    assert sequence_score(expected, [*calls, ToolCall("c", {})], all_or_nothing=True) == 1.0
    assert sequence_score(expected, _calls(("b", {}), ("c", {}))) == 0.0  # step 1 never matched: no credit after


@pytest.mark.parametrize(
    ("expected", "actual", "match"),
    [
        (" Paris ", "paris", True),
        (42, "42.0", True),
        ("1,000", 1000, True),
        (True, "true", False),
        ([1, "a"], [1.0, "A"], True),
        ({"k": 1}, {"k": 1, "extra": 2}, False),
        ("a b", "a  b", True),
    ],
)
def test_values_match(expected, actual, match):
    assert values_match(expected, actual) is match


def test_episode_reward_gate_and_mean():
    truth = {"must_call_tool": "a", "tool_sequence": [{"tool": "a"}, {"tool": "b"}], "answer": ["7", "seven"]}
    assert episode_reward(truth, [], "7") == (0.0, {"reward/must_call_tool": 0.0})
    reward, parts = episode_reward(truth, _calls(("a", {})), "Seven")
    assert reward == pytest.approx((0.5 + 1.0) / 2) and parts["reward/tool_sequence"] == 0.5
    assert episode_reward({"must_call_tool": True}, _calls(("z", {})), None)[0] == 1.0
    assert episode_reward({"answer": "x"}, [], None)[0] == 0.0


# ---------------------------------------------------------------- construction and limits


def test_limits_and_bad_rows_fail_with_clear_errors():
    options = EnvConfig(name="mcp", mcp_servers=["a=cmd-a", "b=cmd-b", "c=http://127.0.0.1:1/mcp"])
    pool = MCPPool()  # nothing here starts a server
    with pytest.raises(ToolLimitError, match=r"3 MCP servers \(a, b, c\) but limits.max_servers is 2"):
        make("mcp", reward_spec={"ground_truth": {"limits": {"max_servers": 2}}}, options=options, pool=pool)
    env = make("mcp", reward_spec={"ground_truth": {}}, extra_info={"mcp_servers": ["b"]}, options=options, pool=pool)
    assert isinstance(env, MCPToolEnv) and [s.name for s in env.servers] == ["b"]
    with pytest.raises(ValueError, match=r"names MCP server 'zzz'; env.mcp_servers has \['a', 'b', 'c'\]"):
        make("mcp", reward_spec={"ground_truth": {}}, extra_info={"mcp_servers": ["zzz"]}, options=options, pool=pool)
    with pytest.raises(ValueError, match="exactly one of 'command'"):
        make(
            "mcp",
            reward_spec={"ground_truth": {}},
            extra_info={"mcp_servers": [{"name": "x"}]},
            options=options,
            pool=pool,
        )
    with pytest.raises(ValueError, match="ground_truth'] must be a dict or an answer value"):
        make("mcp", reward_spec={"ground_truth": [3]}, options=options, pool=pool)
    with pytest.raises(ValueError, match=r"'name=command args...'"):
        make("mcp", reward_spec={"ground_truth": {}}, options=EnvConfig(mcp_servers=["no-equals-sign"]), pool=pool)


def test_max_tools_is_enforced_at_discovery():
    async def main():
        pool = MCPPool()
        env = make(
            "mcp",
            reward_spec={"ground_truth": {"limits": {"max_tools": 3}}},
            extra_info={"mcp_servers": [faulty_entry()]},
            options=EnvConfig(name="mcp"),
            pool=pool,
        )
        try:
            with pytest.raises(ToolLimitError, match=r"tools discovered .* but limits.max_tools is 3"):
                await env.ainit([{"role": "user", "content": "hi"}])
        finally:
            await env.aclose()
            await pool.aclose()

    asyncio.run(main())


# ---------------------------------------------------------------- whole episodes


def _episode(texts: list[str], row: dict, options: EnvConfig, max_turns: int = 4):
    chat = ChatTokenizer(build_tokenizer())
    engine = ScriptedEngine(chat, texts)
    limits = LoopLimits(max_turns=max_turns, max_input_length=4096, max_generate_length=256, max_sequence_length=8192)

    async def go():
        pool = MCPPool()
        env = make("mcp", reward_spec=row["reward_spec"], extra_info=row["extra_info"], options=options, pool=pool)
        try:
            traj = await run_episode(engine, env, chat, row["prompt"], limits, SamplingConfig())
            return traj, env
        finally:
            await env.aclose()
            await pool.aclose()

    traj, env = asyncio.run(go())
    return traj, env, chat.decode(engine.prompts[0])


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "llama3"])
def test_episode_with_server_and_local_tools_earns_full_reward(parser):
    fmt = TOOL_CALL_FORMATTERS[parser]
    row = {
        "prompt": [{"role": "user", "content": "Add 2 and 3, then shout 'ok'."}],
        "reward_spec": {
            "ground_truth": {
                "must_call_tool": "add",
                "tool_sequence": [{"tool": "add", "parameters": {"a": 2, "b": 3}}, {"tool": "shout"}],
                "answer": "5",
            }
        },
        "extra_info": {"mcp_servers": [faulty_entry("faulty", tools=["add", "echo"])]},
    }
    texts = [fmt("add", {"a": 2, "b": 3}), fmt("shout", {"text": "ok"}), "<answer>5</answer>"]
    options = EnvConfig(name="mcp", tool_parser=parser, tool_groups=["test_mcp_env:LOCAL_TOOLS"])
    traj, env, first_prompt = _episode(texts, row, options)
    assert traj.stop_reason == "stop" and traj.num_turns == 3
    assert sum(traj.rewards) == 1.0
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["5", "OK"]
    assert env.num_tool_calls == 2 and env.num_tool_failures == 0
    assert '"name": "add"' in first_prompt and '"name": "shout"' in first_prompt  # tools rendered by the template
    assert '"name": "crash"' not in first_prompt  # only the row's chosen server tools


def test_episode_with_bad_calls_gets_error_observations_and_zero_reward():
    row = {
        "prompt": [{"role": "user", "content": "Add 2 and 3."}],
        "reward_spec": {"ground_truth": {"tool_sequence": [{"tool": "add", "parameters": {"a": 2, "b": 3}}]}},
        "extra_info": {"mcp_servers": [faulty_entry("faulty", tools=["add"])]},
    }
    texts = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, </tool_call>',
        '<tool_call>{"name": "subtract", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": "two", "b": 3}}</tool_call>',
        "I give up.",
    ]
    traj, env, first_prompt = _episode(texts, row, EnvConfig(name="mcp", render_tools=False))
    assert "<tools>" not in first_prompt  # render_tools = false keeps schemas out; the tools still work
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_texts[0].startswith("error: invalid JSON")
    assert tool_texts[1] == "error: unknown tool 'subtract'; available tools: add"
    assert tool_texts[2].startswith("error: bad arguments for 'add': a: 'two' is not of type 'integer'")
    assert traj.stop_reason == "stop" and sum(traj.rewards) == 0.0
    assert env.num_tool_calls == 3 and env.num_tool_failures == 3
    assert traj.env_metrics["tool_failures"] == 3.0


@pytest.mark.slow
def test_calculator_rows_replay_through_the_mcp_env_with_the_calculator_server():
    """The spine's calculator rows and solutions, unchanged, earn reward 1 through MCPToolEnv (and 0 when wrong)."""
    rows = generate_rows("calculator", 3, seed=1, split="eval")
    options = EnvConfig(name="mcp", mcp_servers=[f"calculator={sys.executable} -m thermik.tasks.calculator.server"])
    for row in rows:
        texts = [m["content"] for m in solve(row) if m["role"] == "assistant"]
        traj, _, first_prompt = _episode(texts, {**row, "extra_info": {}}, options)
        assert sum(traj.rewards) == 1.0, traj.messages
        assert '"name": "calculate"' in first_prompt
    wrong, _, _ = _episode([texts[0], "<answer>-1</answer>"], {**rows[-1], "extra_info": {}}, options)
    assert sum(wrong.rewards) == 0.0


# ---------------------------------------------------------------- block order, errors reported as text

_MIXED = (
    TOOL_CALL_FORMATTERS["hermes"]("add", {"a": 2, "b": 3})
    + '<tool_call>{"name": "add", "arguments": {"a": 2, </tool_call>'
    + TOOL_CALL_FORMATTERS["hermes"]("echo", {"text": "hi"})
)


def test_a_turn_mixing_good_and_malformed_calls_answers_in_block_order():
    row = {
        "prompt": [{"role": "user", "content": "Add 2 and 3."}],
        "reward_spec": {"ground_truth": {"must_call_tool": "add"}},
        "extra_info": {"mcp_servers": [faulty_entry("faulty", tools=["add", "echo"])]},
    }
    traj, env, _ = _episode([_MIXED, "done"], row, EnvConfig(name="mcp"))
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_texts[0] == "5" and tool_texts[1].startswith("error: invalid JSON") and tool_texts[2] == "hi"
    assert env.num_tool_calls == 3 and env.num_tool_failures == 1


def test_server_tools_answer_in_block_order_and_apply_the_error_pattern():
    """The tool_use envs (calculator, text2sql, search, code) share ServerTools.run_turn."""
    schemas = [function_schema("add", "", {}, []), function_schema("echo", "", {}, [])]
    text = _MIXED + TOOL_CALL_FORMATTERS["hermes"]("echo", {"text": "ERROR: database is locked"})

    async def go(options: EnvConfig):
        pool = MCPPool()
        try:
            return await ServerTools(faulty_server_spec(), schemas, options, pool).run_turn(text)
        finally:
            await pool.aclose()

    plain = asyncio.run(go(EnvConfig()))
    assert [m["content"][:13] for m in plain.observations] == ["5", "error: invali", "hi", "ERROR: databa"]
    assert plain.calls == 4 and plain.failures == 1
    flagged = asyncio.run(go(EnvConfig(tool_error_pattern=r"^ERROR:")))
    assert flagged.observations[3]["content"] == "error: ERROR: database is locked"
    assert flagged.failures == 2


@pytest.mark.parametrize(("pattern", "reward", "failures"), [(None, 1.0, 0), (r"^ERROR:", 0.0, 1)])
def test_an_error_pattern_makes_text_errors_failed_calls(pattern, reward, failures):
    row = {
        "prompt": [{"role": "user", "content": "Echo."}],
        "reward_spec": {"ground_truth": {"must_call_tool": "echo"}},
        "extra_info": {"mcp_servers": [faulty_entry("faulty", tools=["echo"])]},
    }
    call = TOOL_CALL_FORMATTERS["hermes"]("echo", {"text": "ERROR: no such table"})
    traj, env, _ = _episode([call, "done"], row, EnvConfig(name="mcp", tool_error_pattern=pattern))
    assert sum(traj.rewards) == reward and env.num_tool_failures == failures


def test_a_bad_error_pattern_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="tool_error_pattern"):
        EnvConfig(tool_error_pattern="(unclosed")

"""Fault injection through MCPToolEnv and the agent loop, against the real faulty MCP server.

Each fault (server crash mid-episode, hang past the timeout, unknown tool, bad arguments, 10 MB output,
non-UTF-8 bytes on the protocol stream, a server that dies on every call) must end in a clear error
observation or stop reason; the same episode can still earn its reward after the fault, the next
episode on the same pool works, and no child process is left once the pool closes (checked when the module's
event loop ends: all tests share one loop, hence one pool and one server process, as a training run does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psutil
import pytest
from test_mcp_env import faulty_entry
from test_rollout import ScriptedEngine

from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits, run_episode
from thermik.tasks.registry import make_env
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call as call

ECHO_OK = call("echo", {"text": "ok"})
TRUTH = {"tool_sequence": [{"tool": "echo", "parameters": {"text": "ok"}}], "answer": "ok"}
TOOLS = ["echo", "crash", "block", "big_output", "non_utf8"]


def _children() -> list[int]:
    live = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return live


@pytest.fixture(scope="module")
def pool() -> MCPPool:
    """One pool, hence one shared server, for the module (closed with the runner)."""
    return MCPPool()


@pytest.fixture(scope="module")
def runner(pool: MCPPool) -> Iterator[asyncio.Runner]:
    """One event loop for the module; at the end nothing may be left."""
    before = set(_children())
    with asyncio.Runner() as r:
        yield r
        r.run(pool.aclose())
    assert set(_children()) <= before, "a server process outlived the pool"


def _play(
    runner: asyncio.Runner,
    pool: MCPPool,
    scripts: list[list[str]],
    server_args: tuple[str, ...] = (),
    max_turns: int = 4,
    **options,
):
    """Play the scripts as consecutive episodes on the module's loop (one shared pool); returns trajectories."""
    chat = ChatTokenizer(build_tokenizer())
    limits = LoopLimits(max_turns=max_turns, max_input_length=8192, max_generate_length=512, max_sequence_length=65536)
    config = EnvConfig(name="mcp", **options)
    row = {
        "prompt": [{"role": "user", "content": "Echo ok, then answer ok."}],
        "reward_spec": {"ground_truth": TRUTH},
        "extra_info": {"mcp_servers": [faulty_entry("faulty", *server_args, tools=TOOLS)]},
    }

    async def go():
        trajectories = []
        for texts in scripts:
            spec, extra_info = row["reward_spec"], row["extra_info"]
            env = make_env("mcp", reward_spec=spec, extra_info=extra_info, options=config, pool=pool)
            try:
                engine = ScriptedEngine(chat, texts)
                trajectories.append(await run_episode(engine, env, chat, row["prompt"], limits, SamplingConfig()))
            finally:
                await env.aclose()
        return trajectories

    return runner.run(go())


def _tool_texts(traj) -> list[str]:
    return [m["content"] for m in traj.messages if m["role"] == "tool"]


def _assert_recovered(traj, next_traj) -> None:
    """After the fault the same episode still earns full reward, and so does the next episode."""
    assert _tool_texts(traj)[-1] == "ok"
    assert sum(traj.rewards) == 1.0 and traj.stop_reason == "stop"
    assert _tool_texts(next_traj) == ["ok"] and sum(next_traj.rewards) == 1.0


ANSWER = "<answer>ok</answer>"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (call("crash", {}), "error: tool 'crash' failed: tool server connection lost"),
        (call("nope", {"x": 1}), "error: unknown tool 'nope'; available tools: echo, crash, block"),
        (call("echo", {"text": 5}), "error: bad arguments for 'echo': text: 5 is not of type 'string'"),
        (call("echo", {}), "error: bad arguments for 'echo': 'text' is a required property"),
        ('<tool_call>{"name": "echo", "arguments": {"text": }</tool_call>', "error: invalid JSON in <tool_call>"),
    ],
    ids=["crash", "unknown_tool", "bad_argument_type", "missing_argument", "malformed_call"],
)
def test_fault_is_an_error_observation_and_the_run_goes_on(runner, pool, fault, expected):
    traj, next_traj = _play(runner, pool, [[fault, ECHO_OK, ANSWER], [ECHO_OK, ANSWER]])
    assert _tool_texts(traj)[0].startswith(expected), _tool_texts(traj)[0]
    assert traj.env_metrics["tool_failures"] == 1.0
    _assert_recovered(traj, next_traj)


@pytest.mark.slow
def test_hung_server_times_out_and_is_replaced(runner, pool):
    t0 = time.perf_counter()
    traj, next_traj = _play(
        runner, pool, [[call("block", {"seconds": 60}), ECHO_OK, ANSWER], [ECHO_OK, ANSWER]], tool_timeout_s=1.0
    )
    assert _tool_texts(traj)[0] == "error: tool 'block' timed out after 1s"
    _assert_recovered(traj, next_traj)
    assert time.perf_counter() - t0 < 45  # nobody waited for the 60 s hang


@pytest.mark.slow
def test_ten_megabyte_output_is_truncated(runner, pool):
    traj, next_traj = _play(
        runner,
        pool,
        [[call("big_output", {"chars": 10_000_000}), ECHO_OK, ANSWER], [ECHO_OK, ANSWER]],
        tool_timeout_s=60.0,
        tool_max_output_chars=2000,
    )
    big = _tool_texts(traj)[0]
    assert big.startswith("x" * 2000) and big.endswith("... [truncated 9998000 chars]")
    assert len(big) < 2100
    _assert_recovered(traj, next_traj)


def test_non_utf8_bytes_on_the_wire_cost_one_line_not_the_episode(runner, pool):
    traj, next_traj = _play(runner, pool, [[call("non_utf8", {}), ECHO_OK, ANSWER], [ECHO_OK, ANSWER]])
    assert _tool_texts(traj)[0] == "after garbage"  # the bad line is dropped; the answer after it arrives
    _assert_recovered(traj, next_traj)


@pytest.mark.slow
def test_server_that_dies_on_every_call_ends_the_episode_at_max_turns(runner, pool):
    (traj,) = _play(runner, pool, [[ECHO_OK, ECHO_OK]], server_args=("--crash-after", "1"), max_turns=2)
    assert traj.stop_reason == "max_turns" and sum(traj.rewards) == 0.0
    assert all("tool server connection lost" in text for text in _tool_texts(traj))
    assert traj.env_metrics["tool_failures"] == 2.0

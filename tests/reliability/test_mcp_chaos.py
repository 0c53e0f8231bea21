"""MCP chaos. Episodes of random tool calls against real faulty MCP servers (one starts slowly): crash
(connection loss), hang, slow answer, huge output, non-UTF-8 bytes on the wire, unknown tool, bad arguments. No
step may raise, every faulty call must get a clear `error: ...` observation (a huge output: the truncation
note), and when the pool closes no server process and no file descriptor may remain.

Bounded in CI (CHAOS_EPISODES_CI); `RELIABILITY_FULL=1` runs CHAOS_EPISODES_FULL.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest
from fixtures.faulty_server import server_spec
from kill_suite import leaked_servers

from thermik.config.schema import EnvConfig
from thermik.envs.tool_use import ServerTools, function_schema
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call

CHAOS_EPISODES_CI = 24
CHAOS_EPISODES_FULL = 100
TOOLS = ["echo", "sleep", "block", "crash", "big_output", "non_utf8", "add"]
FAULTS: dict[str, tuple[str, dict, str]] = {
    # kind: (tool, arguments, what the observation must show)
    "ok": ("echo", {"text": "hi"}, "hi"),
    "slow": ("sleep", {"seconds": 0.2}, "slept 0.2s"),
    "hang": ("block", {"seconds": 30}, "error: tool 'block' timed out"),
    "crash": ("crash", {}, "error: "),
    "huge": ("big_output", {"chars": 1_000_000}, "[truncated"),
    "garbage": ("non_utf8", {}, "after garbage"),
    "unknown": ("nonexistent", {}, "error: unknown tool 'nonexistent'"),
    "bad_args": ("add", {"a": "two", "b": 1}, "error: "),
}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _episodes(count: int, marker: Path, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    options = EnvConfig(tool_timeout_s=1.0, tool_max_output_chars=2000)
    schemas = [function_schema(name, "", {}, []) for name in TOOLS]
    specs = [server_spec("--state-file", str(marker)), server_spec("--state-file", str(marker), "--start-delay", "1")]
    figures = dict.fromkeys(("episodes", "calls", "faulty_calls", "clear_errors", "crashed_steps", "unclear"), 0)
    pool = MCPPool()
    try:
        for _ in range(count):
            tools = ServerTools(rng.choice(specs), schemas, options, pool)
            kinds = [rng.choice(sorted(FAULTS)) for _ in range(rng.randint(1, 3))]
            action = "".join(format_hermes_tool_call(FAULTS[k][0], FAULTS[k][1]) for k in kinds)
            figures["episodes"] += 1
            try:
                turn = await tools.run_turn(action)
            except Exception:
                figures["crashed_steps"] += 1
                continue
            for kind, observation in zip(kinds, turn.observations, strict=True):
                figures["calls"] += 1
                faulty = kind not in ("ok", "slow", "garbage")
                figures["faulty_calls"] += faulty
                shown = FAULTS[kind][2] in observation["content"]
                figures["clear_errors"] += faulty and shown
                figures["unclear"] += not shown
    finally:
        await pool.aclose()
    return figures


def run_chaos(count: int, workdir: Path, seed: int = 18) -> dict[str, int | float]:
    marker = workdir / "chaos.marker"
    fds_before, t0 = _fds(), time.perf_counter()
    figures: dict[str, int | float] = dict(asyncio.run(_episodes(count, marker, seed)))
    time.sleep(0.5)  # the pool's background closes finish
    figures |= {"leaked_processes": leaked_servers(marker), "leaked_fds": max(0, _fds() - fds_before)}
    return figures | {"seconds": round(time.perf_counter() - t0, 1)}


@pytest.mark.slow
def test_mcp_chaos_episodes(tmp_path):
    full = os.environ.get("RELIABILITY_FULL") == "1"
    figures = run_chaos(CHAOS_EPISODES_FULL if full else CHAOS_EPISODES_CI, tmp_path)
    print(figures)
    assert figures["crashed_steps"] == 0 and figures["unclear"] == 0
    assert figures["clear_errors"] == figures["faulty_calls"] > 0
    assert figures["leaked_processes"] == 0 and figures["leaked_fds"] == 0

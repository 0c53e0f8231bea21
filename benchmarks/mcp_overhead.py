"""Per-call cost of thermik's MCP pool against a raw `ClientSession` call, and `mcp`-env episode throughput.

Both sides call the same calculator MCP server (one process each, started once) in the same run;
rounds alternate raw/pool so machine noise hits both alike. Target: pool/raw <= 1.2x.
Then 64 concurrent MCPToolEnv episodes (scripted actions: two tool calls and an answer, no model)
share one pooled server; their throughput is printed.

Run: `python benchmarks/mcp_overhead.py [--calls 200] [--rounds 5] [--episodes 64]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass

from mcp import ClientSession
from mcp.client.stdio import stdio_client

from thermik.config.schema import EnvConfig
from thermik.tasks.calculator.server import TOOL_NAME, server_spec
from thermik.tasks.registry import make_env
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import format_hermes_tool_call


@dataclass(frozen=True)
class OverheadResult:
    raw_ms: float
    pool_ms: float
    episodes: int
    episodes_per_s: float
    calls_per_s: float

    @property
    def ratio(self) -> float:
        return self.pool_ms / self.raw_ms


async def _timed_calls(call, n: int) -> float:
    """Mean milliseconds per call over n sequential calls."""
    t0 = time.perf_counter()
    for i in range(n):
        await call(f"{i} * 3")
    return (time.perf_counter() - t0) * 1000 / n


async def per_call_ms(calls: int, rounds: int) -> tuple[float, float]:
    """(raw, pool) median over rounds of the mean ms per sequential call."""
    spec = server_spec()
    pool = MCPPool(kill_with_parent=False)  # the same launch as the raw side, to compare calls only
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(spec.params(kill_with_parent=False), errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            async def raw(expression: str) -> None:
                await session.call_tool(TOOL_NAME, {"expression": expression}, read_timeout_seconds=10)

            async def pooled(expression: str) -> None:
                await pool.call_tool(spec, TOOL_NAME, {"expression": expression}, 10)

            await raw("1")
            await pooled("1")  # starts the pool's server
            raw_ms, pool_ms = [], []
            for _ in range(rounds):
                raw_ms.append(await _timed_calls(raw, calls))
                pool_ms.append(await _timed_calls(pooled, calls))
    await pool.aclose()
    return statistics.median(raw_ms), statistics.median(pool_ms)


async def episode_throughput(episodes: int) -> tuple[float, float]:
    """(episodes/s, tool calls/s) of concurrent `mcp` episodes sharing one pooled calculator server."""
    spec = server_spec()
    entry = {"name": "calculator", "command": spec.command, "args": list(spec.args), "env": dict(spec.env)}
    options = EnvConfig(name="mcp", tool_timeout_s=30)
    actions = [
        format_hermes_tool_call(TOOL_NAME, {"expression": "2 + 3"}),
        format_hermes_tool_call(TOOL_NAME, {"expression": "5 * 4"}),
        "<answer>20</answer>",
    ]
    truth = {"tool_sequence": [{"tool": TOOL_NAME}, {"tool": TOOL_NAME}], "answer": "20"}
    pool = MCPPool()

    async def one() -> float:
        extra_info = {"mcp_servers": [entry]}
        env = make_env("mcp", reward_spec={"ground_truth": truth}, extra_info=extra_info, options=options, pool=pool)
        try:
            await env.ainit([{"role": "user", "content": "compute"}])
            reward = 0.0
            for action in actions:
                out = await env.astep(action)
                reward += out.reward
            return reward
        finally:
            await env.aclose()

    await one()  # start the server outside the timing
    t0 = time.perf_counter()
    rewards = await asyncio.gather(*(one() for _ in range(episodes)))
    elapsed = time.perf_counter() - t0
    await pool.aclose()
    if rewards != [1.0] * episodes:
        raise RuntimeError(f"episodes did not all earn reward 1: {rewards}")
    return episodes / elapsed, 2 * episodes / elapsed


def run(calls: int, rounds: int, episodes: int) -> OverheadResult:
    raw_ms, pool_ms = asyncio.run(per_call_ms(calls, rounds))
    eps, cps = asyncio.run(episode_throughput(episodes))
    return OverheadResult(raw_ms, pool_ms, episodes, eps, cps)


def format_report(result: OverheadResult) -> str:
    verdict = "ok" if result.ratio <= 1.2 else "above the 1.2x target"
    return (
        f"raw ClientSession call: {result.raw_ms:.3f} ms\n"
        f"MCPPool call:           {result.pool_ms:.3f} ms\n"
        f"ratio pool/raw:         {result.ratio:.2f}x ({verdict})\n"
        f"{result.episodes} concurrent mcp episodes: {result.episodes_per_s:.1f} episodes/s, "
        f"{result.calls_per_s:.1f} tool calls/s"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="Sequential calls per round and side.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating raw/pool rounds (median reported).")
    parser.add_argument("--episodes", type=int, default=64, help="Concurrent mcp episodes.")
    args = parser.parse_args(argv)
    for name in ("calls", "rounds", "episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> OverheadResult:
    args = parse_args(argv)
    result = run(args.calls, args.rounds, args.episodes)
    print(format_report(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

"""CPU per request of the remote backend's HTTP path: the lean keep-alive client against httpx, one real server.

Starts `thermik inference` on --model (one torch thread, on a free loopback port), then sends --rounds waves of
--concurrency `/v1/completions` requests (a 100-token prompt, --max-tokens new tokens, so decoding costs little)
through `RemoteEngine` twice: over its lean HTTP/1.1 client (what an http:// server gets) and over httpx (what an
https:// server gets). It prints, per request, the wall time and the CPU time of the client process and of the
server process. A split RL step of the calculator sends about 190 such requests (96 episodes of about 2 turns).

    thermik model init --preset qwen2-1m --out runs/models/qwen2-1m
    python benchmarks/remote_client_overhead.py --model runs/models/qwen2-1m --concurrency 96 --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from thermik.inference.base import SamplingParams
from thermik.inference.remote import RemoteEngine


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def measure(url: str, server: int, args: argparse.Namespace, lean: bool) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) per request, in ms."""
    engine = RemoteEngine(url)
    if not lean:
        engine._client = httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=512,
                                           max_keepalive_connections=512, keepalive_expiry=2.0))  # fmt: skip
        engine._client_loop = asyncio.get_running_loop()
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    prompt = list(range(10, 110))
    try:
        await asyncio.gather(*(engine.generate(prompt, sampling) for _ in range(args.concurrency)))  # warm-up
        c0, s0, t0 = time.process_time(), cpu_seconds(server), time.perf_counter()
        for _ in range(args.rounds):
            await asyncio.gather(*(engine.generate(prompt, sampling) for _ in range(args.concurrency)))
        n = args.rounds * args.concurrency
        wall, client, served = time.perf_counter() - t0, time.process_time() - c0, cpu_seconds(server) - s0
        return wall / n * 1e3, client / n * 1e3, served / n * 1e3
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory (thermik model init ...)")
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1)
    args = parser.parse_args()
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "thermik.cli", "inference", f"--model.path={args.model}", f"--server.port={port}"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        print(f"{args.concurrency} requests in flight x {args.rounds} rounds, {args.max_tokens} new token(s) each")
        print(f"{'client':<10}{'wall ms/req':>13}{'client CPU ms/req':>19}{'server CPU ms/req':>19}")
        for name, lean in (("lean", True), ("httpx", False)):
            wall, client, served = asyncio.run(measure(url, proc.pid, args, lean))
            print(f"{name:<10}{wall:>13.2f}{client:>19.2f}{served:>19.2f}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()

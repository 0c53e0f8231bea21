"""One run of an agent harness as a process of its own: `agent.command` through the shell, or `agent.entrypoint`
called by agents/bootstrap.py in `agent.python`'s interpreter.

Each run gets its own session (process group) and dies with this process (thermik.lifetime). Its descendants are
recorded while it runs; when it exits, runs past `agent.timeout_s` or its episode is cancelled, everything left of its
tree is SIGKILLed, so no process outlives its episode. Its result is THERMIK_RESULT_FILE's JSON when the harness wrote
that file, else the last line of its stdout that parses as JSON, else None.

A run fails (HarnessOutcome.failure) when it exits non-zero or by a signal (`crash`), runs past the timeout
(`timeout`), or exits leaving processes behind (`left_processes`); `detail` says how, with the end of its stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thermik.agents.fork_server import ServerGone, fork_server
from thermik.config.agent import AgentConfig
from thermik.lifetime import ProcessTree, dying_with_parent

BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
POLL_S = 0.5  # how often the harness's process tree is recorded (a /proc scan); its exit is seen at once
STDERR_TAIL = 600


@dataclass(frozen=True)
class Client:
    """Where the harness sends its model calls, and where it may POST its reward."""

    base_url: str
    api_key: str
    model: str
    reward_url: str = ""

    def environment(self) -> dict[str, str]:
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model,
                "EPISODE_REWARD_URL": self.reward_url}  # fmt: skip


@dataclass
class HarnessOutcome:
    result: Any = None
    failure: str = ""  # "" when the run succeeded; else crash | timeout | left_processes
    detail: str = ""
    elapsed: float = 0.0
    posted_reward: float | None = None  # POSTed by the harness to its episode's reward URL
    posted_metrics: dict[str, float] = field(default_factory=dict)


def harness_argv(cfg: AgentConfig) -> list[str]:
    if cfg.command:
        return ["/bin/sh", "-c", cfg.command]
    return [cfg.python or sys.executable, str(BOOTSTRAP), cfg.entrypoint]


async def run_harness(cfg: AgentConfig, task: dict[str, Any], client: Client) -> HarnessOutcome:
    """Run the harness once on `task` (see the module docstring). Its stdout and stderr go to files: a pipe would be
    held open by a process it leaves behind."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="thermik-harness-") as tmp:
        files = {name: Path(tmp) / name for name in ("result.json", "stdout", "stderr")}
        episode_env = {**client.environment(), "THERMIK_TASK": json.dumps(task, default=str),
                       "THERMIK_RESULT_FILE": str(files["result.json"])}  # fmt: skip
        try:
            pid, exited = await _start(cfg, episode_env, files["stdout"], files["stderr"])
        except ServerGone as gone:
            return HarnessOutcome(failure="crash", detail=_server_gone(gone), elapsed=time.perf_counter() - start)
        tree = ProcessTree(pid)
        try:
            timed_out = await _wait(exited, tree, cfg.timeout_s)
        finally:  # also when the episode is cancelled
            left = [p for p in tree.kill() if p != pid]
            code, gone_detail = await _exit_code(exited)
        stdout, stderr = (files[name].read_text(errors="replace") for name in ("stdout", "stderr"))
        outcome = HarnessOutcome(_result(files["result.json"], stdout), elapsed=time.perf_counter() - start)
    outcome.failure, outcome.detail = _failure(cfg, code, timed_out, left, stderr)
    if gone_detail and not outcome.failure:
        outcome.failure, outcome.detail = "crash", gone_detail
    return outcome


async def _start(cfg: AgentConfig, env: dict[str, str], stdout: Path, stderr: Path) -> tuple[int, asyncio.Future[int]]:
    """The harness's process for one episode: forked by the fork server (`agent.preload`) or started by exec; its
    pid and a future of its return code."""
    if cfg.preload and cfg.entrypoint:
        child = await (await fork_server(cfg)).fork(env, stdout, stderr)
        return child.pid, child.exited
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *dying_with_parent(harness_argv(cfg)), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
            cwd=cfg.cwd or None, env={**os.environ, **env}, start_new_session=True,
        )  # fmt: skip
    return proc.pid, asyncio.ensure_future(proc.wait())


async def _wait(exited: asyncio.Future[int], tree: ProcessTree, timeout_s: float) -> bool:
    """Wait for the harness to exit, recording its tree meanwhile; True when it ran past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not exited.done():
        tree.record()
        if time.monotonic() > deadline:
            return True
        await asyncio.wait({exited}, timeout=min(POLL_S, max(deadline - time.monotonic(), 0.001)))
    tree.record()
    return False


async def _exit_code(exited: asyncio.Future[int]) -> tuple[int | None, str]:
    """The harness's return code once it has exited (its tree was just killed), or None and why when its fork
    server went first."""
    try:
        return await asyncio.shield(exited), ""
    except ServerGone as gone:
        return None, _server_gone(gone)


def _server_gone(gone: ServerGone) -> str:
    said = f"; its stderr ends: {gone}" if str(gone) else ""
    return f"the fork server of agent.preload exited before the harness did{said}"


def _result(result_file: Path, stdout: str) -> Any:
    """THERMIK_RESULT_FILE's JSON, else stdout's last JSON line, else None."""
    if result_file.exists():
        try:
            return json.loads(result_file.read_text() or "null")
        except json.JSONDecodeError:
            return None
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def _failure(cfg: AgentConfig, code: int | None, timed_out: bool, left: list[int], stderr: str) -> tuple[str, str]:
    tail = stderr.strip()[-STDERR_TAIL:]
    said = f"; its stderr ends: {tail}" if tail else ""
    if timed_out:
        return "timeout", f"the harness ran past agent.timeout_s = {cfg.timeout_s:g} s and was killed{said}"
    if code:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return "crash", f"the harness {how}{said}"
    if left:
        return "left_processes", f"the harness exited leaving {len(left)} processes behind (killed: {left})"
    return "", ""

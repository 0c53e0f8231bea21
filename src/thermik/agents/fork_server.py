"""`agent.preload`: one process per run imports the entrypoint's module, then forks a child per episode
(agents/bootstrap.py `--serve`), so an episode no longer pays the harness's imports (openai-agents: about 2 s of CPU).

Each child is still a process of its own, in a session of its own, with the episode's environment and output files:
agents/process.py waits for it, records its tree, kills it at the timeout and reads its result exactly as for a
harness started by exec. The trade-off: the module is imported once, so one that starts threads or an event loop
at import time must leave `agent.preload` off, and a change to it is seen by the next run, not the next episode.

One server per (interpreter, entrypoint, working directory, event loop), started on first use; it dies with this
process, and with its event loop's run (its reader task is cancelled when `asyncio.run` ends). If it exits (its
module failed to import), the episodes it had fail as crashes with its stderr, and the next one starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from thermik.config.agent import AgentConfig
from thermik.lifetime import dying_with_parent

BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
STDERR_TAIL = 600


class ServerGone(Exception):
    """The fork server exited (the message is the end of its stderr)."""


@dataclass
class Child:
    """An episode's forked process: its pid and, once the server has reaped it, its return code."""

    pid: int
    exited: asyncio.Future[int]


@dataclass
class ForkServer:
    proc: asyncio.subprocess.Process
    stderr: Path
    ids: itertools.count[int] = field(default_factory=itertools.count)
    forks: dict[int, asyncio.Future[Child]] = field(default_factory=dict)
    children: dict[int, Child] = field(default_factory=dict)
    reader: asyncio.Task[None] = field(init=False)

    async def fork(self, env: dict[str, str], stdout: Path, stderr: Path) -> Child:
        """Start one episode's child with `env` added to its environment, its stdout and stderr to those files."""
        if self.reader.done():
            raise ServerGone("")
        request_id = next(self.ids)
        forked = self.forks[request_id] = asyncio.get_running_loop().create_future()
        line = json.dumps({"id": request_id, "env": env, "stdout": str(stdout), "stderr": str(stderr)})
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await self.proc.stdin.drain()
        return await forked

    async def read(self) -> None:
        """Dispatch the server's replies; when it exits, fail everything still waiting on it; when this task is
        cancelled (its loop's run ends), kill it."""
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                reply = json.loads(line)
                if "id" in reply:
                    child = Child(reply["pid"], asyncio.get_running_loop().create_future())
                    self.children[child.pid] = child
                    self.forks.pop(reply["id"]).set_result(child)
                elif (child := self.children.pop(reply["pid"], None)) is not None:
                    child.exited.set_result(reply["code"])
        finally:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
            gone = ServerGone(self.stderr.read_text(errors="replace").strip()[-STDERR_TAIL:])
            self.stderr.unlink(missing_ok=True)
            for future in [*self.forks.values(), *(child.exited for child in self.children.values())]:
                if not future.done():
                    future.set_exception(gone)
            self.forks.clear(), self.children.clear()


_SERVERS: dict[tuple[str, str, str, int], asyncio.Task[ForkServer]] = {}


async def fork_server(cfg: AgentConfig) -> ForkServer:
    """This run's fork server for `cfg`'s entrypoint (see the module docstring); the episodes that start together
    wait for the same one."""
    key = (cfg.python, cfg.entrypoint, cfg.cwd, id(asyncio.get_running_loop()))
    starting = _SERVERS.get(key)
    if starting is None or (starting.done() and _gone(starting)):
        starting = _SERVERS[key] = asyncio.ensure_future(_start(cfg))
    return await asyncio.shield(starting)


def _gone(started: asyncio.Task[ForkServer]) -> bool:
    return started.cancelled() or started.exception() is not None or started.result().reader.done()


async def _start(cfg: AgentConfig) -> ForkServer:
    stderr = Path(tempfile.mkstemp(prefix="thermik-fork-server-", suffix=".stderr")[1])
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *dying_with_parent([cfg.python or sys.executable, str(BOOTSTRAP), "--serve", cfg.entrypoint]),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err, cwd=cfg.cwd or None,
            start_new_session=True,
        )  # fmt: skip
    server = ForkServer(proc, stderr)
    server.reader = asyncio.ensure_future(server.read())
    return server

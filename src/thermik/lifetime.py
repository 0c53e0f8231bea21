"""Child processes that end with the process that started them, whatever ends it (`kill -9` included).

- `dying_with_parent(argv)`: `argv` run through a tiny exec wrapper that asks the kernel (Linux PR_SET_PDEATHSIG)
  to SIGKILL the child when its parent dies, checks that the parent is still there (it may have died before the
  request took hold), then execs `argv`: the child is the command itself, with the wrapper's pid. Every level sets
  it for its own children, so a chain (split launcher -> orchestrator -> MCP server) goes down level by level. The
  kernel sends the signal when the *thread* that started the child ends: start such children from a thread that
  lives as long as they should (the main thread, the event loop's).
- `die_with_parent_source(parent_pid)`: the same request as source code, for a child that runs a `-c` bootstrap of
  its own.
- `start_reaper(root_pids)`: for processes that other software starts on our behalf and that outlive their own
  parent (Ray's raylet starts agents and workers that survive it). A small watchdog process, in a session of its
  own, records the process trees under `root_pids` every `REAP_POLL_S` while this process lives, and SIGKILLs what
  is left of them as soon as this process has died (its end of a pipe closes). It exits by itself once every
  process it recorded has ended (e.g. after `ray.shutdown()`).

Spawn sites: the split launcher, stdio MCP servers, the code sandbox and `pip download` use the first two; `init_ray`
the reaper. The verifiers bridge (a process in another venv) needs neither: it stops at the end of its stdin, which
closes when this process dies, and its env server stops on its own death pipe.

This module runs as the watchdog's script too (`python -I -S lifetime.py`), so it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

PR_SET_PDEATHSIG = 1
REAP_POLL_S = 0.5
_LINUX = sys.platform.startswith("linux")


def die_with_parent_source(parent_pid: int) -> str:
    """Python source that makes the process running it die with `parent_pid` (its parent), or exit at once if that
    parent already went (then the process was re-parented before the request took hold). For a child whose command
    line is built elsewhere (a sandbox's bootstrap); the setting survives execve but not a change of credentials
    (`unshare -r`), so such a child runs it after that change. Empty where there is no such signal (not Linux)."""
    if not _LINUX:
        return ""
    return (
        "import ctypes,os,signal,sys\n"
        f"ctypes.CDLL(None,use_errno=True).prctl({PR_SET_PDEATHSIG},signal.SIGKILL)\n"
        f"os.getppid()=={parent_pid} or sys.exit('thermik: the parent process exited before this one started')\n"
    )


_reapers: list[subprocess.Popen[bytes]] = []  # kept referenced: their stdin pipe's write end is this process's life


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` so that the process it starts is SIGKILLed when this process dies (Linux; elsewhere `argv` as is)."""
    if not _LINUX:
        return list(argv)
    wrapper = die_with_parent_source(os.getpid()) + "os.execvp(sys.argv[1],sys.argv[1:])\n"
    return [sys.executable, "-I", "-S", "-c", wrapper, *argv]


def child_pids(pid: int) -> set[int]:
    """The live direct children of `pid` (Linux /proc; empty elsewhere)."""
    return {child for child, parent in _parents().items() if parent == pid}


class ProcessTree:
    """A process and everything it starts, recorded while it runs (`record`) so that descendants re-parented away
    from it (a daemonised grandchild) are still known; `kill` SIGKILLs its process group and every recorded process
    still alive. For a child started in a session of its own (`start_new_session=True`): an agent harness."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen = {root: start} if (start := _start_time(root)) is not None else {}

    def record(self) -> None:
        _record(self.seen)

    def alive(self) -> list[int]:
        """The recorded processes still alive, the root included."""
        return _alive(self.seen)

    def kill(self) -> list[int]:
        """SIGKILL what is left (its process group, then every recorded process); the pids that were alive."""
        self.record()
        left = self.alive()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.root, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return left


def start_reaper(root_pids: Iterable[int]) -> None:
    """Start the watchdog that SIGKILLs the trees under `root_pids` once this process has died (see the docstring)."""
    roots = sorted(set(root_pids))
    if not _LINUX or not roots:
        return
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), *map(str, roots)]
    reaper = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    _reapers.append(reaper)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process that is not a zombie."""
    out = {}
    for name in os.listdir("/proc") if _LINUX else ():
        if name.isdigit() and (stat := _stat(int(name))) is not None and stat[0] != "Z":
            out[int(name)] = int(stat[1])
    return out


def _stat(pid: int) -> list[str] | None:
    """Fields 3... of /proc/<pid>/stat (state, ppid, ..., starttime at index 19), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    """The process's start time (tells a pid apart from a later process that reuses it); None: gone or a zombie."""
    stat = _stat(pid)
    return None if stat is None or stat[0] == "Z" else stat[19]


def _record(seen: dict[int, str]) -> None:
    """Add every live descendant of a live recorded process to `seen` (pid -> start time)."""
    parents = _parents()
    alive = {pid for pid, start in seen.items() if _start_time(pid) == start}
    grew = True
    while grew:
        new = {pid for pid, parent in parents.items() if parent in alive and pid not in alive}
        for pid in new:
            if (start := _start_time(pid)) is not None:
                seen.setdefault(pid, start)
        alive |= new
        grew = bool(new)


def _alive(seen: dict[int, str]) -> list[int]:
    return [pid for pid, start in seen.items() if _start_time(pid) == start]


def _reap(parent_pid: int, roots: list[int]) -> None:
    """The watchdog: record while `parent_pid` lives (stdin open), then kill what was recorded."""
    seen = {pid: start for pid in roots if (start := _start_time(pid)) is not None}
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], REAP_POLL_S)
        if (readable and not os.read(sys.stdin.fileno(), 4096)) or _start_time(parent_pid) is None:
            break  # EOF: the parent has died (or exited)
        _record(seen)
        if not _alive(seen):
            return  # everything recorded ended by itself (a clean shutdown)
    for _ in range(50):
        _record(seen)  # what the recorded processes started meanwhile
        left = _alive(seen)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


if __name__ == "__main__":
    _reap(int(sys.argv[1]), [int(a) for a in sys.argv[2:]])

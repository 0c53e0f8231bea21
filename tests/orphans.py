"""Helpers of the no-orphans tests: is a recorded process still running, and what is left after a kill -9."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

GONE_WITHIN_S = 10.0


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of `procs` still running (a zombie has ended; psutil tells a reused pid apart)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def left_after_kill(starter: subprocess.Popen, procs: list[psutil.Process]) -> list[str]:
    """SIGKILL `starter`; the command lines of `procs` still running GONE_WITHIN_S later (killed then, so that
    nothing is left for the next test)."""
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + GONE_WITHIN_S
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = alive(procs)
    out = [" ".join(p.cmdline())[:160] for p in left]
    for p in left:
        p.kill()
    return out


def children_started_after(before: set[int]) -> list[psutil.Process]:
    """This process's running descendants whose pid is not in `before`: what one test started and left, whatever
    earlier tests' module-scoped servers still run."""
    return [p for p in alive(psutil.Process().children(recursive=True)) if p.pid not in before]


def children_now() -> set[int]:
    return {p.pid for p in alive(psutil.Process().children(recursive=True))}


_EARLIER: set[int] = set()


@pytest.fixture(autouse=True)
def earlier_children() -> None:
    """Imported by a test module, it makes `new_children()` ignore what ran before each test (other modules'
    servers are not that test's to reap)."""
    _EARLIER.clear()
    _EARLIER.update(children_now())


def new_children() -> list[psutil.Process]:
    """This process's running descendants started since the current test began (see `earlier_children`)."""
    return children_started_after(_EARLIER)

"""Hand the CPU between two threads that both run PyTorch: release the calling thread's OpenMP worker pool.

Each thread that runs a parallel PyTorch op owns an OpenMP team whose workers stay alive between ops. With
two such threads (the training loop and the embedded engine's scheduler), libgomp counts more managed
threads than CPUs and throttles spin-waiting for everyone: every op then wakes its workers through a futex,
and a small model's decode step or forward runs markedly slower (docs/inference.md) even while the
other thread sleeps. A thread about to wait for the other one calls `release_thread_pool()`
(OpenMP 5.0 `omp_pause_resource_all`, which frees only the caller's pool); its next parallel op builds a new
pool, which is cheap. A no-op where torch has no OpenMP runtime with that call.

Work handed to a worker thread (`asyncio.to_thread`: the policy update, a weight update) leaves that thread's pool
alive when it returns; `to_thread_releasing` frees it there, or an RL step's decode steps slow down after the
first update.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

OMP_PAUSE_SOFT = 1
_RUNTIMES = ("libgomp", "libiomp", "libomp")


@cache
def _pause_all() -> ctypes._CFuncPtr | None:
    import torch  # noqa: F401  (loads the OpenMP runtime torch uses)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if any(name in line for name in _RUNTIMES)}
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers (not inside a parallel region). True if a runtime did it."""
    pause = _pause_all()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0


def _releasing(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    try:
        return fn(*args, **kwargs)
    finally:
        release_thread_pool()


async def to_thread_releasing(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`asyncio.to_thread(fn, ...)` that frees the worker thread's OpenMP pool when fn returns (or raises), and the
    caller's before it waits."""
    release_thread_pool()
    return await asyncio.to_thread(_releasing, fn, *args, **kwargs)

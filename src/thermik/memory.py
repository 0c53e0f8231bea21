"""Hand memory that the process has freed back to the operating system (glibc's `malloc_trim`).

glibc keeps freed heap memory in per-thread arenas for reuse by the same thread. In an RL step the embedded engine
allocates on its scheduler thread and the update on a worker thread, so without a trim each phase's peak stays
resident while the other runs, and a process that runs two trainings one after the other (benchmarks/
rl_step_precision.py) keeps the first one's peak, enough for the OOM killer to end it. Trimming
after each update and at the end of a run returns those pages. A no-op where the C library has no malloc_trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return the free pages of every malloc arena to the OS (tens of ms on a multi-GB heap)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

"""`python kill_hook.py SPEC_JSON rl ARGS...`: `thermik rl` (local or Ray mode) with probes on its phases, which
SIGKILL the process at a chosen moment and record the order in which the sampler handed out prompts.

SPEC: {"log": dir} plus, for a kill, {"phase": generation|update|checkpoint|mcp, "occurrence": k, "delay_s": d}:
`d` seconds into the k-th entry into `phase` (an async phase shorter than `d`: as it completes; the blocking
checkpoint write, if it has ended by then: as soon as it runs again), the process writes what it was doing to
`<log>/kills.jsonl` and kills itself with SIGKILL (no handler, no cleanup: what kill -9 from outside does). Every
completed rollout appends `{"step", "prompts"}` to `<log>/order.jsonl` (a sha of each trajectory's prompt ids).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import thermik.runs.local as local
import thermik.runs.ray as ray_mode
from thermik.cli import main
from thermik.tools.mcp_pool import MCPPool

SPEC = json.loads(sys.argv[1])
LOG = Path(SPEC["log"])
PHASES = ("checkpoint", "mcp", "update", "generation")  # innermost first
active = dict.fromkeys(PHASES, 0)
entries = dict.fromkeys(PHASES, 0)


def _append(name: str, record: dict) -> None:
    with open(LOG / name, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _kill(target: str) -> None:
    now = [p for p in PHASES if active[p]]
    _append("kills.jsonl", {"target": target, "phase": target if target in now else (now or ["between"])[0],
                            "active": now, "time": time.time()})  # fmt: skip
    os.kill(os.getpid(), signal.SIGKILL)


def _enter(phase: str) -> bool:
    """Count the entry; True when this is the entry to kill in."""
    active[phase] += 1
    entries[phase] += 1
    return SPEC.get("phase") == phase and entries[phase] == SPEC["occurrence"]


def _killer(phase: str) -> None:
    """Kill `delay_s` after the entry if the phase still runs, else as soon as it runs again."""
    time.sleep(SPEC["delay_s"])
    while not active[phase]:
        time.sleep(0.0005)
    _kill(phase)


def _probe_async(fn, phase: str):
    """An async phase is killed from inside: `delay_s` into it, or as it completes if it is shorter."""

    @functools.wraps(fn)
    async def probed(*args, **kwargs):
        target = _enter(phase)
        try:
            if target:
                task = asyncio.ensure_future(fn(*args, **kwargs))
                await asyncio.wait({task}, timeout=SPEC["delay_s"])
                _kill(phase)  # never returns
            return await fn(*args, **kwargs)
        finally:
            active[phase] -= 1

    return probed


def _probe_sync(fn, phase: str):
    """A blocking phase (the checkpoint write) is killed by a thread: the write releases the GIL for its I/O."""

    @functools.wraps(fn)
    def probed(*args, **kwargs):
        if _enter(phase):
            threading.Thread(target=_killer, args=(phase,), daemon=True).start()
        try:
            return fn(*args, **kwargs)
        finally:
            active[phase] -= 1

    return probed


async def _recorded_rollout(ctx, step: int):
    rollout = await _sample(ctx, step)
    prompts = [
        hashlib.sha1(str(t.prompt_ids).encode()).hexdigest()[:12]
        for t in rollout.sampled[:: ctx.cfg.trainer.group_size]
    ]
    _append("order.jsonl", {"step": step + 1, "prompts": prompts})
    return rollout


_sample = _probe_async(local.sample_rollout, "generation")
local.sample_rollout = _recorded_rollout
local.learner_update = _probe_async(local.learner_update, "update")
local.save_checkpoint = _probe_sync(local.save_checkpoint, "checkpoint")
# The Ray mode (distributed.enabled): the same phases, as the driver sees them (the update and the checkpoint write
# run on the trainer worker while the driver waits; killing the driver takes its local Ray down with it).
ray_mode.sample_rollout = _recorded_rollout
ray_mode.RayMode.update = _probe_async(ray_mode.RayMode.update, "update")
ray_mode.RayMode.save = _probe_sync(ray_mode.RayMode.save, "checkpoint")
MCPPool.call_tool = _probe_async(MCPPool.call_tool, "mcp")

if __name__ == "__main__":
    sys.exit(main(sys.argv[2:]))

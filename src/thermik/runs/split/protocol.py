"""The file protocol between `thermik orchestrator` and `thermik trainer` (docs/process_split.md).

Both processes share the run directory. The orchestrator publishes `rollouts/step_<s>/` (the collated batch of step
s); the trainer publishes `weights/step_<s>/` (the policy after s updates). A directory is published atomically:
written as `.tmp_*`, a `DONE` marker written last, then renamed; a reader counts a step directory only when its
marker is there, so it never sees a partial one (also after a non-atomic copy to shared storage).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, save_file

from thermik.atomic import publish_dir as publish_atomic
from thermik.atomic import remove_dir
from thermik.runs.split.doorbell import Doorbell
from thermik.training.batch import TokenBatch

T = TypeVar("T")
DONE = "DONE"
BATCH_FILE = "batch.safetensors"
TRAJECTORIES_FILE = "trajectories.jsonl"
META_FILE = "meta.json"
STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class SplitLayout:
    """Where each process reads and writes inside the run directory."""

    run_dir: Path

    @property
    def rollouts(self) -> Path:
        return self.run_dir / "rollouts"

    @property
    def weights(self) -> Path:
        return self.run_dir / "weights"

    @property
    def trainer_dir(self) -> Path:
        """The trainer's own metrics.jsonl, plots and config copy."""
        return self.run_dir / "trainer"

    @property
    def orchestrator_dir(self) -> Path:
        """The orchestrator's own metrics.jsonl, plots, config copy and resume state."""
        return self.run_dir / "orchestrator"

    @property
    def orchestrator_state(self) -> Path:
        return self.orchestrator_dir / "state.json"

    def rollout_dir(self, step: int) -> Path:
        return self.rollouts / f"step_{step}"

    def weights_dir(self, step: int) -> Path:
        return self.weights / f"step_{step}"


def published_steps(root: Path) -> list[int]:
    """Steps of the complete `step_<n>` directories (DONE marker present) under root, ascending."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / DONE).is_file()]
    return sorted(steps)


def publish_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp_dir)`, add the DONE marker and rename tmp_dir to `final` (replacing an older copy, e.g. of a
    restarted process)."""

    def write_then_mark(tmp: Path) -> None:
        write(tmp)
        (tmp / DONE).write_text(f"{time.time():.3f}\n")

    return publish_atomic(final, write_then_mark)


def prune_steps(root: Path, below: int) -> None:
    """Remove published step directories with step < below (shared-memory segments stay: they are reused slots)."""
    for step in published_steps(root):
        if step < below:
            remove_dir(root / f"step_{step}")


# ---------------------------------------------------------------- batches


def save_batch(batch: TokenBatch, directory: Path) -> None:
    """The collated batch's tensors (those that are set) as directory/batch.safetensors."""
    tensors = {k: v.contiguous() for k, v in batch.__dict__.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, str(directory / BATCH_FILE))


def load_batch(directory: Path) -> TokenBatch:
    return TokenBatch(**load_file(str(directory / BATCH_FILE)))


# ---------------------------------------------------------------- waiting


class SplitTimeout(RuntimeError):
    """One process waited longer than split.wait_timeout_s for the other."""


async def wait_until(
    ready: Callable[[], T | Awaitable[T | None] | None],
    timeout_s: float,
    poll_s: float,
    waiting_for: str,
    check: str,
    doorbell: Doorbell | None = None,
) -> T:
    """Look at `ready()` (plain or async) until it returns something other than None: again when `doorbell` rings
    (the other process published something), at the latest every poll_s; after timeout_s raise SplitTimeout naming
    what was waited for and which process to check."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = ready()
        if inspect.isawaitable(value):
            value = await value
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise SplitTimeout(
                f"waited {timeout_s:g} s for {waiting_for}; check {check}, or raise split.wait_timeout_s if it is "
                "only slow"
            )
        if doorbell is None:
            await asyncio.sleep(poll_s)
        else:
            await doorbell.wait(poll_s)

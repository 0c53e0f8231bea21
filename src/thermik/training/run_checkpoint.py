"""The one writer and restorer of an RL run's checkpoints, for the local, split and Ray modes alike.

A checkpoint (`checkpoints/step_<n>`, written atomically by `CheckpointManager`) holds the policy, its optimizer
state, the RNG states, the LR schedule, the adaptive KL weight, the critic (advantage "gae") and the caller's
extras (the sampler's position). What "the policy" and "its optimizer state" are depends on where the learner runs;
a `TrainingStateView` says it: the whole model in one process (`WholeState`), or a data-parallel rank's view of
the model it shares with the other ranks (distributed/rank_state.py: every rank joins the gathering of FSDP2
shards, rank 0 writes, every rank loads). Everything else is written and read here, once.

`checkpoint.on_write_error` decides what a failed write does (`on_write_error`): stop the run with
`CheckpointWriteError`, or warn and train on. The Ray driver applies it to the failure its rank 0 reports, so the
setting behaves the same in every mode.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from thermik.config.trainer import CheckpointConfig
from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state

if TYPE_CHECKING:
    from thermik.training.learner import Learner

CRITIC_DIR = "critic"  # inside a checkpoint directory: critic weights and optimizer


class TrainingStateView(Protocol):
    """The policy and optimizer state a checkpoint holds, as one process sees them."""

    writes: bool  # this process writes the files (the one process; rank 0 of a data-parallel group)

    def model(self) -> Any:
        """Something with `save_pretrained(path)` that writes the whole policy (a collective on FSDP2 ranks)."""
        ...

    def optimizer(self) -> Any:
        """Something with `state_dict()` giving the whole optimizer state (a collective on FSDP2 ranks)."""
        ...

    def load(self, directory: Path) -> dict[str, Any]:
        """Load the policy, optimizer and RNG states of `directory` in place; returns its saved extras with "step"."""
        ...

    def written(self) -> None:
        """Every process of the group has reached the end of a write (a barrier; nothing in one process)."""
        ...


class WholeState:
    """One process holds the whole policy and optimizer: the local and split modes."""

    writes = True

    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.policy, self._optimizer = policy, optimizer

    def model(self) -> Any:
        return self.policy

    def optimizer(self) -> Any:
        return self._optimizer

    def load(self, directory: Path) -> dict[str, Any]:
        return load_training_state(directory, self.policy, self._optimizer)

    def written(self) -> None:
        return None


class CheckpointWriteFailure(Exception):
    """A checkpoint write failed (disk full, I/O error); the message says where, why and what is left intact."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written and `checkpoint.on_write_error` is 'stop'."""


def _view(learner: Learner) -> TrainingStateView:
    return learner.state_view or WholeState(learner.policy, learner.optimizer)


def restore(learner: Learner, checkpoint: Path | None = None) -> dict[str, Any] | None:
    """Load `checkpoint`, or else the newest one (when checkpoint.resume), into the learner; returns its saved extras
    (with "step") or None. On a data-parallel rank every rank calls it."""
    latest = checkpoint or (learner.checkpoints.latest() if learner.cfg.checkpoint.resume else None)
    if latest is None:
        return None
    extra = _view(learner).load(Path(latest))
    if learner.critic is not None:  # the same on every rank
        learner.critic.load(Path(latest) / CRITIC_DIR)
    learner.start_step = int(extra["step"])
    learner.scheduler.load_state_dict(extra.pop("scheduler"))
    learner.algo.kl.value = float(extra.pop("kl_coef", learner.algo.kl.value))  # the adaptive KL weight goes on
    return extra


def write_checkpoint(learner: Learner, step: int, extra: dict[str, Any] | None = None) -> Path | None:
    """Policy, optimizer, RNG, scheduler, KL weight (+ critic) as checkpoints/step_<step>, atomically; returns its
    path where this process wrote it (None on the other ranks). Raises CheckpointWriteFailure (after every rank is
    through) when the write failed; the partial write is gone and the earlier checkpoints are as they were."""
    view = _view(learner)
    state = {**(extra or {}), "step": step, "scheduler": learner.scheduler.state_dict()}
    state["kl_coef"] = learner.algo.kl.value
    model, optimizer = view.model(), view.optimizer()  # every rank: FSDP2 gathers its shards here

    def write(directory: Path) -> None:
        save_training_state(directory, model, optimizer, step, extra=state)
        if learner.critic is not None:
            learner.critic.save(directory / CRITIC_DIR)

    failure: CheckpointWriteFailure | None = None
    path = None
    if view.writes:
        try:
            path = learner.checkpoints.save(step, write)
        # Disk full or an I/O error (torch.save reports a full disk as a RuntimeError): the partial write is gone.
        except (OSError, RuntimeError) as exc:
            failure = CheckpointWriteFailure(_failure_message(learner.checkpoints, step, exc))
            failure.__cause__ = exc
    view.written()
    if failure is not None:
        raise failure
    return path


def save_checkpoint(learner: Learner, step: int, extra: dict[str, Any] | None = None) -> Path | None:
    """`write_checkpoint`, with a failed write handled as `checkpoint.on_write_error` says (one process)."""
    try:
        return write_checkpoint(learner, step, extra)
    except CheckpointWriteFailure as failure:
        on_write_error(learner.cfg.checkpoint, failure)
        return None


def on_write_error(cfg: CheckpointConfig, failure: CheckpointWriteFailure) -> None:
    """A failed write stops the run (CheckpointWriteError) or, with on_write_error 'continue', warns and returns."""
    if cfg.on_write_error == "stop":
        raise CheckpointWriteError(f"{failure} (checkpoint.on_write_error = 'stop')") from failure.__cause__
    warnings.warn(f"{failure}; training goes on (checkpoint.on_write_error = 'continue')", RuntimeWarning, 3)


def _failure_message(checkpoints: CheckpointManager, step: int, exc: BaseException) -> str:
    previous, root = checkpoints.latest(), checkpoints.root
    intact = f"{previous.name} is intact and latest names it" if previous else "there is no earlier checkpoint"
    return (
        f"checkpoint step_{step} could not be written to {root} ({shutil.disk_usage(root).free} bytes free there): "
        f"{type(exc).__name__}: {exc}; {intact}"
    )

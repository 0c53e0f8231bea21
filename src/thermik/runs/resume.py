"""Resume only under the config the checkpoints were made with (docs/reliability.md, "Resume under another config").

Before a process touches anything, `check_resume` compares the config.toml a run left in its directory with the
new config, when `checkpoint.resume` is on and there is something to resume (a checkpoint, or a split
orchestrator's state). Every key that differs and is not in `SAFE_KEYS` changes what the checkpoints mean (another
model, env, data, algorithm, LoRA, group size, precision, seed, ...): the start is refused with one line listing
those keys with their old and new values. The keys of `SAFE_KEYS` only say how far, where and how visibly the same
training runs (more steps, logging, evaluation, checkpoint cadence, timeouts, ports, threads): they may change, and
the accepted run lists them.

config.toml is written by `accept_config` once the run is accepted (its setup done: policy loaded, checkpoint
restored), never by a refused or failed start; an earlier, different config.toml is kept beside it as
config.<n>.toml (n = 1, 2, ... in order).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from thermik.atomic import write_text_atomic
from thermik.config.loader import dump_toml
from thermik.config.schema import RunConfig, SFTConfig
from thermik.config.upgrade import upgrade_tree
from thermik.errors import ThermikError
from thermik.runs.split.protocol import SplitLayout
from thermik.training.checkpoint import CheckpointManager

CONFIG_FILE = "config.toml"

# Keys that may differ between a run's saved config and the config that resumes it. An entry ending in "." is a
# whole section. Everything else changes what the checkpoints mean, so a difference there is refused.
SAFE_KEYS: tuple[str, ...] = (
    # where the run is, how far it goes
    "name", "output_dir", "trainer.steps", "max_steps",
    # checkpoints, logging, progress, records, guards
    "checkpoint.", "monitor.", "progress", "record", "guards.", "failures.", "rewards.max_unscored_steps",
    # held-out evaluation (what is measured, not what is trained)
    "eval.", "data.eval_path", "data.eval_split", "data.synthetic_eval_size",
    "eval_every", "eval_size", "eval_path", "eval_temperature", "stop_at", "min_steps", "eval_every_step_from",
    "stop_window",
    # where processes listen and how long they wait
    "server.host", "server.port", "server.api_key", "server.access_log", "split.",
    "inference.num_threads", "inference.kv_cache_gb", "inference.base_url", "inference.api_key",
    "inference.served_model_name", "inference.weights_dir", "inference.timeout_s",
    "env.tool_timeout_s", "env.openenv.ca_file", "rewards.judge.api_key", "rewards.judge.timeout_s",
    "rewards.judge.retries", "rewards.judge.retry_backoff_s", "rewards.judge.concurrency",
    "algorithm.teacher.api_key", "algorithm.teacher.timeout_s", "algorithm.teacher.concurrency",
    # how the same update is spread over Ray workers (distributed.enabled itself is not in the list)
    "distributed.num_trainers", "distributed.num_engines", "distributed.placement", "distributed.strategy",
    "distributed.backend", "distributed.weight_sync", "distributed.weights_dir", "distributed.cpus_per_actor",
    "distributed.gpus_per_actor", "distributed.engine_max_restarts", "distributed.timeout_s",
    "distributed.ray_address",
)  # fmt: skip


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between the saved config and the new one."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def is_safe(key: str) -> bool:
    return any(key == safe or (safe.endswith(".") and key.startswith(safe)) for safe in SAFE_KEYS)


def check_resume(cfg: RunConfig | SFTConfig, out_dir: Path | None = None) -> list[ConfigChange]:
    """The safe changes a resumed start makes to its saved config (empty when it resumes nothing); raises a
    ThermikError, touching nothing, when the run directory's checkpoints were made with a config that differs in
    a key outside SAFE_KEYS."""
    out_dir = out_dir or cfg.run_dir
    resumed = resumable_state(cfg)
    saved = out_dir / CONFIG_FILE
    if resumed is None:
        return []
    if not saved.is_file():
        return []
    changes = config_changes(saved.read_text(), cfg)
    refused = [c for c in changes if not is_safe(c.key)]
    if refused:
        raise ThermikError(
            f"{cfg.run_dir} holds {resumed} of a run made with another config ({saved}): "
            f"{', '.join(map(str, refused))}; resuming would continue those checkpoints under settings they were not "
            "trained with",
            hint="start a new run with --name NEW, or start this one over with --checkpoint.resume false "
            "(its checkpoints are replaced as it saves)",
        )
    return changes


def resumable_state(cfg: RunConfig | SFTConfig) -> str | None:
    """What a start with checkpoint.resume would continue: the newest checkpoint's name, or the split orchestrator's
    state file; None when there is nothing (or checkpoint.resume is off)."""
    if not cfg.checkpoint.resume:
        return None
    latest = CheckpointManager(cfg.run_dir / "checkpoints", keep=1).latest()
    if latest is not None:
        return f"checkpoint {latest.name}"
    state = SplitLayout(cfg.run_dir).orchestrator_state
    return f"the orchestrator's {state.name}" if isinstance(cfg, RunConfig) and state.is_file() else None


def config_changes(saved_text: str, cfg: RunConfig | SFTConfig) -> list[ConfigChange]:
    """Every key whose value differs between a saved config.toml and `cfg` (a key absent on one side counts with
    its default: the saved file is read through the config model when it still validates; a file of an earlier
    layout is upgraded first, config/upgrade.py)."""
    raw, _ = upgrade_tree(tomllib.loads(saved_text))
    try:
        old = _flat(tomllib.loads(dump_toml(type(cfg).model_validate(raw))))
    except ValidationError:  # a file of another thermik version: compare what it says
        old = _flat(raw)
    new = _flat(tomllib.loads(dump_toml(cfg)))
    keys = sorted(old.keys() | new.keys())
    return [ConfigChange(k, old.get(k), new.get(k)) for k in keys if not _same(k, old.get(k), new.get(k))]


def accept_config(cfg: RunConfig | SFTConfig, out_dir: Path) -> Path | None:
    """Write `cfg` as out_dir/config.toml (the run is accepted); an earlier, different one is kept first as
    config.<n>.toml, which is returned (None when there was none to keep)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path, text = out_dir / CONFIG_FILE, dump_toml(cfg)
    kept = None
    if path.is_file() and (old := path.read_text()) != text:
        kept = _free_name(out_dir)
        write_text_atomic(kept, old, durable=True)
    write_text_atomic(path, text, durable=True)
    return kept


def resumed_message(step: int, data_position: int | None, run_dir: Path, changes: list[ConfigChange]) -> str:
    """The line a resumed run prints: "resumed from step 40 (data position 640): runs/x" (+ its safe changes)."""
    position = f" (data position {data_position})" if data_position is not None else ""
    changed = f"; changed settings: {', '.join(map(str, changes))}" if changes else ""
    return f"resumed from step {step}{position}: {run_dir}{changed}"


def _free_name(out_dir: Path) -> Path:
    n = 1
    while (out_dir / f"config.{n}.toml").exists():
        n += 1
    return out_dir / f"config.{n}.toml"


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(key: str, old: Any, new: Any) -> bool:
    """Equal values; paths (keys named path or *_path) are equal when they name the same file."""
    if old == new:
        return True
    is_path = key.rsplit(".", 1)[-1] == "path" or key.endswith("_path")
    if is_path and isinstance(old, str) and isinstance(new, str) and old and new:
        return os.path.realpath(old) == os.path.realpath(new)
    return False


def _show(value: Any) -> str:
    return "(unset)" if value is None else repr(value)

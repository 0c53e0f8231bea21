"""Metric sinks: one JSON line per step in `run_dir/metrics.jsonl`, optionally tensorboard and wandb.

The jsonl file is the source of truth (plots and reports read it); the other sinks are
optional mirrors imported lazily so `thermik.monitor` stays light.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def to_float(key: str, value: Any) -> float | int | None:
    """A JSON-safe number from a python/numpy/torch scalar; NaN and inf become None (JSON null)."""
    if hasattr(value, "item") and callable(value.item):  # torch tensor, numpy scalar or 0-d array
        shape = tuple(getattr(value, "shape", ()))
        if math.prod(shape) != 1:
            raise TypeError(f"metric '{key}' must be a scalar, got an array with shape {shape}")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"metric '{key}' must be a number, got {type(value).__name__}: {value!r}")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl; a torn last line (crash mid-write) is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    lines = path.read_text().splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON line: {line[:80]!r}") from None
    return records


class MetricsLogger:
    """Appends `{"step": s, "timestamp": t, **metrics}` per call; mirrors to tensorboard / wandb if asked."""

    def __init__(
        self, run_dir: str | Path, tensorboard: bool = False, wandb_project: str = "", wandb_mode: str = "offline"
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = _tensorboard_writer(self.run_dir / "tensorboard") if tensorboard else None
        self._wandb = _wandb_run(wandb_project, self.run_dir, wandb_mode) if wandb_project else None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: to_float(k, v) for k, v in metrics.items()}
        record = {"step": int(step), "timestamp": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in values.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def truncate_after(self, step: int) -> int:
        """Drop records with `step >= step` (a resumed run re-logs them); returns how many were dropped."""
        self._file.close()
        records = read_metrics(self.path) if self.path.exists() else []
        kept = [r for r in records if r.get("step", -1) < step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        return len(records) - len(kept)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensorboard_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(
            "monitor.tensorboard=true needs the 'tensorboard' package: pip install -e \".[sinks]\" "
            f"(or set --monitor.tensorboard false). Import failed with: {e}"
        ) from None
    return SummaryWriter(log_dir=str(log_dir))


def _wandb_run(project: str, run_dir: Path, mode: str) -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(
            f"monitor.wandb_project={project!r} needs the 'wandb' package: pip install -e \".[sinks]\" "
            "(or leave --monitor.wandb_project empty)."
        ) from None
    # offline: the run lives in run_dir/wandb/offline-run-*; `wandb sync` uploads it later
    return wandb.init(project=project, name=run_dir.name, dir=str(run_dir), mode=mode)

"""Terminal progress bar and tables (rich); disabled mode writes nothing at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


def format_metrics(metrics: dict[str, float]) -> str:
    """`reward 0.531 · 1.24 s/step`: `step_s` reads as seconds per step, other values to 3 digits."""
    parts = []
    for key, value in metrics.items():
        if value is None:
            continue
        parts.append(f"{value:.2f} s/step" if key == "step_s" else f"{key} {value:.3g}")
    return " · ".join(parts)


class StepProgress:
    """`with StepProgress(total, "train") as p: p.update(step, metrics={...})`."""

    def __init__(
        self, total: int, description: str = "train", enabled: bool = True, console: Console | None = None
    ) -> None:
        self.total = total
        self.description = description
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )
            self._task = self._progress.add_task(description, total=total, info="")

    def __enter__(self) -> StepProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def update(self, step: int, metrics: dict[str, float] | None = None) -> None:
        """Mark `step` steps done and show `metrics` (e.g. reward, step_s) beside the bar."""
        if self._progress is None:
            return
        self._progress.update(self._task, completed=step, info=format_metrics(metrics or {}))

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], console: Console | None = None
) -> None:
    """A rich table, e.g. the before/after evaluation; floats shown to 3 decimals."""
    table = Table(title=title)
    for col in columns:
        table.add_column(str(col))
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table '{title}': row {list(row)} has {len(row)} cells, expected {len(columns)}")
        table.add_row(*(f"{c:.3f}" if isinstance(c, float) else str(c) for c in row))
    (console or Console()).print(table)

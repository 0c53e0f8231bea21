"""PNG plots of a run's metrics.jsonl (matplotlib, Agg canvas: no display, no global pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thermik.monitor.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LOSS_KEYS = ("policy/loss", "policy/kl", "policy/grad_norm", "policy/clip_frac")
_X_LABELS = {"step": "RL step", "timestamp": "wall time (s)", "progress/samples": "samples trained"}


def series(records: Sequence[dict[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    """(x, y) pairs of records that have both keys with a finite value; `timestamp` becomes elapsed seconds."""
    xs, ys = [], []
    for r in records:
        x, y = r.get(x_key), r.get(y_key)
        if x is None or y is None or not math.isfinite(y):
            continue
        xs.append(float(x))
        ys.append(float(y))
    if x_key == "timestamp" and xs:
        t0 = min(float(r["timestamp"]) for r in records if r.get("timestamp") is not None)
        xs = [x - t0 for x in xs]
    return xs, ys


def _moving_average(ys: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _draw(ax: Axes, records: Sequence[dict[str, Any]], x_key: str, y_key: str, label: str | None = None) -> bool:
    """One series on `ax`: raw line (plus a moving average when long); sparse series get markers."""
    xs, ys = series(records, x_key, y_key)
    if not xs:
        return False
    label = label or y_key
    sparse = len(xs) < 0.5 * len(records) or len(xs) <= 20
    window = max(1, len(xs) // 25)
    if window > 1:
        (line,) = ax.plot(xs, ys, alpha=0.3, linewidth=1)
        ax.plot(
            xs, _moving_average(ys, window), color=line.get_color(), linewidth=2, label=f"{label} (avg of {window})"
        )
    else:
        ax.plot(xs, ys, marker="o" if sparse else None, markersize=4, linewidth=1.5, label=label)
    return True


def _new_figure(rows: int) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.4)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")


def plot_series(
    records: Sequence[dict[str, Any]],
    x_key: str,
    y_keys: Sequence[str],
    out_path: str | Path,
    *,
    title: str = "",
    xlabel: str | None = None,
    ylabel: str = "",
) -> Path:
    """One panel with every `y_keys` series against `x_key` (e.g. reward vs samples or wall time)."""
    present = [k for k in y_keys if series(records, x_key, k)[0]]
    if not present:
        available = sorted({k for r in records for k in r})
        raise ValueError(f"none of {list(y_keys)} has values against '{x_key}'; keys in the records: {available}")
    fig = _new_figure(1)
    ax = fig.add_subplot(1, 1, 1)
    for key in present:
        _draw(ax, records, x_key, key)
    _finish(ax, title or ", ".join(present), xlabel or _X_LABELS.get(x_key, x_key), ylabel)
    return _save(fig, out_path)


def _save(fig: Figure, out_path: str | Path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    return out_path


def _plot_reward(records: list[dict[str, Any]], out_path: Path) -> Path | None:
    has_len = bool(series(records, "step", "response_length/mean")[0])
    fig = _new_figure(2 if has_len else 1)
    ax = fig.add_subplot(2 if has_len else 1, 1, 1)
    drawn = _draw(ax, records, "step", "reward/mean", "train reward (mean)")
    drawn |= _draw(ax, records, "step", "eval/success", "eval success")
    if not drawn:
        return None
    _finish(ax, "Reward", "RL step", "reward / success")
    if has_len:
        ax2 = fig.add_subplot(2, 1, 2, sharex=ax)
        _draw(ax2, records, "step", "response_length/mean", "response length (mean)")
        _finish(ax2, "Response length", "RL step", "tokens")
    return _save(fig, out_path)


def _plot_loss(records: list[dict[str, Any]], out_path: Path) -> Path | None:
    present = [k for k in LOSS_KEYS if series(records, "step", k)[0]]
    if not present:
        return None
    fig = _new_figure(len(present))
    first = None
    for i, key in enumerate(present):
        ax = fig.add_subplot(len(present), 1, i + 1, sharex=first)
        first = first or ax
        _draw(ax, records, "step", key)
        _finish(ax, key, "RL step", key.split("/", 1)[-1])
    return _save(fig, out_path)


def plot_run(metrics_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write `out_dir/plots/reward.png`, `loss.png`, and `reward_vs_samples.png` / `reward_vs_time.png` (each only
    when its metrics exist)."""
    records = read_metrics(metrics_path)
    plots_dir = Path(out_dir) / "plots"
    written = [_plot_reward(records, plots_dir / "reward.png"), _plot_loss(records, plots_dir / "loss.png")]
    if series(records, "progress/samples", "reward/mean")[0]:
        for x_key, name in (("progress/samples", "reward_vs_samples.png"), ("timestamp", "reward_vs_time.png")):
            written.append(plot_series(records, x_key, ["reward/mean"], plots_dir / name, title="train reward"))
    return [p for p in written if p is not None]

"""`thermik monitor RUN --summary`: a run's state in the terminal, from its directory alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from thermik.monitor.progress import print_table
from thermik.monitor.web import list_trajectories, read_evals, read_run_metrics, read_trajectories

KEYS = (
    "reward/mean", "eval/success", "policy/loss", "policy/kl", "policy/entropy", "response_length/mean",
    "time/step", "off_policy/staleness_max",
)  # fmt: skip


def print_summary(run: Path) -> None:
    """Steps, first / last / best of the main curves, the evaluations and the failures of the newest rollouts."""
    records = read_run_metrics(run)
    steps = max((r["step"] for r in records), default=0)
    rows = []
    for key in KEYS:
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            rows.append([key, values[0], values[-1], max(values), len(values)])
    print_table(f"{run.name}: {steps} steps", ["metric", "first", "last", "max", "points"], rows)
    evals = read_evals(run)["evals"]
    if evals:
        table = [
            [label, r.get("success", 0.0), r.get("reward", 0.0), r.get("k", 1), r.get("n", 0)]
            for label, r in evals.items()
        ]
        print_table(f"{run.name}: evaluations", ["eval", "success", "reward", "k", "n"], table)
    files = list_trajectories(run)
    if files:
        newest = files[-1]["file"]
        counts = Counter(r.get("failure") or "solved" for r in read_trajectories(run, newest))
        print_table(f"{run.name}: {newest}", ["outcome", "episodes"], [[k, v] for k, v in counts.most_common()])

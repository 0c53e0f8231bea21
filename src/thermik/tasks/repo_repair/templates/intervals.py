"""Template family `intervals` (training rows): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _overlaps(r: random.Random) -> Unit:
    return unit(
        "overlaps",
        """
def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]
""",
        "whether two half-open intervals overlap",
        "overlaps((0, 5), (4, 8))", "overlaps((0, 5), (5, 8))", "overlaps((3, 4), (0, 10))", "overlaps((6, 9), (1, 2))",
    )  # fmt: skip


def _merge_intervals(r: random.Random) -> Unit:
    return unit(
        "merge_intervals",
        """
def merge_intervals(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
""",
        "merging overlapping intervals",
        "merge_intervals([(1, 3), (2, 6), (8, 10)])", "merge_intervals([])",
        "merge_intervals([(5, 7), (1, 2), (2, 4)])",
    )  # fmt: skip


def _total_length(r: random.Random) -> Unit:
    return unit(
        "total_length",
        """
def total_length(intervals):
    return sum((end - start for start, end in intervals if end > start))
""",
        "the total length of a list of intervals",
        "total_length([(0, 3), (5, 6)])", "total_length([])", "total_length([(4, 2), (1, 9)])",
    )  # fmt: skip


def _split_range(r: random.Random) -> Unit:
    step = r.randint(2, 4)
    return unit(
        "split_range",
        f"""
def split_range(start, end, step={step}):
    pieces = []
    for left in range(start, end, step):
        pieces.append((left, min(left + step, end)))
    return pieces
""",
        f"splitting a range into pieces of length {step}",
        "split_range(0, 10)", "split_range(3, 3)", f"split_range(1, {2 + step})",
    )  # fmt: skip


def _gaps(r: random.Random) -> Unit:
    return unit(
        "gaps",
        """
def gaps(intervals, start, end):
    result = []
    cursor = start
    for left, right in sorted(intervals):
        if left > cursor:
            result.append((cursor, left))
        cursor = max(cursor, right)
    if cursor < end:
        result.append((cursor, end))
    return result
""",
        "the free gaps between booked intervals",
        "gaps([(2, 4), (6, 7)], 0, 10)", "gaps([], 0, 5)", "gaps([(0, 5)], 0, 5)",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "ranges": (_overlaps, _merge_intervals, _gaps),
    "measure": (_total_length, _split_range),
}
"""module name -> the units it holds (drawn per package)."""

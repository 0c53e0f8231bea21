"""Template family `stats` (training rows): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _mean(r: random.Random) -> Unit:
    return unit(
        "mean",
        """
def mean(values):
    if not values:
        return 0.0
    total = 0
    for value in values:
        total = total + value
    return total / len(values)
""",
        "the average of a list of numbers",
        "mean([1, 2, 3, 4])", "mean([])", "mean([10])", "mean([-3, 3, 9])",
    )  # fmt: skip


def _clamp(r: random.Random) -> Unit:
    lo, hi = r.randint(-10, 0), r.randint(5, 20)
    return unit(
        "clamp",
        f"""
def clamp(value, low={lo}, high={hi}):
    if value < low:
        return low
    if value > high:
        return high
    return value
""",
        f"clamping a number into the range [{lo}, {hi}]",
        f"clamp({lo - 5})", f"clamp({hi + 3})", f"clamp({(lo + hi) // 2})", f"clamp({hi})", f"clamp({lo})",
    )  # fmt: skip


def _running_max(r: random.Random) -> Unit:
    return unit(
        "running_max",
        """
def running_max(values):
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
""",
        "the running maximum of a sequence",
        "running_max([3, 1, 4, 1, 5])", "running_max([])", "running_max([2, 2, 1])",
    )  # fmt: skip


def _variance(r: random.Random) -> Unit:
    return unit(
        "variance",
        """
def variance(values):
    n = len(values)
    if n < 2:
        return 0.0
    center = sum(values) / n
    return sum(((v - center) ** 2 for v in values)) / (n - 1)
""",
        "the sample variance of a list of numbers",
        "variance([1, 2, 3, 4])", "variance([5])", "variance([2, 4, 4, 4, 5, 5, 7, 9])",
    )  # fmt: skip


def _histogram(r: random.Random) -> Unit:
    width = r.choice([2, 5, 10])
    return unit(
        "histogram",
        f"""
def histogram(values, width={width}):
    counts = {{}}
    for value in values:
        bucket = value // width * width
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts
""",
        f"counting numbers into buckets of width {width}",
        f"histogram([0, 1, {width}, {width + 1}, {3 * width}])", "histogram([])", f"histogram([{width - 1}])",
    )  # fmt: skip


def _median(r: random.Random) -> Unit:
    return unit(
        "median",
        """
def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    middle = n // 2
    if n % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
""",
        "the median of a list of numbers",
        "median([3, 1, 2])", "median([4, 1, 3, 2])", "median([])", "median([7])",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "summary": (_mean, _median, _variance),
    "shape": (_clamp, _running_max, _histogram),
}
"""module name -> the units it holds (drawn per package)."""

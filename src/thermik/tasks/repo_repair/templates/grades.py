"""Template family `grades` (held-out rows only): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _letter_grade(r: random.Random) -> Unit:
    a, b, c = r.choice([(90, 80, 70), (85, 70, 55)])
    return unit(
        "letter_grade",
        f"""
def letter_grade(score):
    if score >= {a}:
        return 'A'
    if score >= {b}:
        return 'B'
    if score >= {c}:
        return 'C'
    return 'F'
""",
        "turning a score into a letter grade",
        f"letter_grade({a})", f"letter_grade({a - 1})", f"letter_grade({b})", f"letter_grade({c - 1})",
        f"letter_grade({c})",
    )  # fmt: skip


def _weighted_score(r: random.Random) -> Unit:
    return unit(
        "weighted_score",
        """
def weighted_score(scores, weights):
    total_weight = sum(weights)
    if total_weight == 0:
        return 0.0
    total = 0
    for score, weight in zip(scores, weights):
        total += score * weight
    return round(total / total_weight, 2)
""",
        "the weighted average of scores",
        "weighted_score([80, 90], [1, 3])", "weighted_score([], [])", "weighted_score([50, 100, 70], [2, 1, 1])",
    )  # fmt: skip


def _passed_count(r: random.Random) -> Unit:
    bar = r.choice([50, 60])
    return unit(
        "passed_count",
        f"""
def passed_count(scores, bar={bar}):
    return len([s for s in scores if s >= bar])
""",
        f"counting the scores of at least {bar}",
        f"passed_count([{bar}, {bar - 1}, 99])", "passed_count([])", "passed_count([0, 100, 100])",
    )  # fmt: skip


def _rank(r: random.Random) -> Unit:
    return unit(
        "rank",
        """
def rank(scores):
    ordered = sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))
    result = {}
    for position, (name, _) in enumerate(ordered):
        result[name] = position + 1
    return result
""",
        "ranking students by score",
        "rank({'ann': 70, 'bob': 90, 'cy': 80})", "rank({})", "rank({'a': 5, 'b': 5})",
    )  # fmt: skip


def _curve(r: random.Random) -> Unit:
    cap = 100
    return unit(
        "curve",
        f"""
def curve(scores, bonus):
    return [min(s + bonus, {cap}) for s in scores]
""",
        "adding a bonus to every score, capped at 100",
        "curve([50, 95], 10)", "curve([], 5)", "curve([100, 0], 1)",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "scores": (_letter_grade, _weighted_score, _curve),
    "ranking": (_passed_count, _rank),
}
"""module name -> the units it holds (drawn per package)."""

"""The template families repo-repair packages are built from.

A family is a set of modules; a module is a list of units; a unit is one function (its source, with constants
drawn per package), a one-line description of what it computes (for problem statements that do not name the
function) and the calls its tests make. Expected values come from running the unit's correct source here
(trusted: our own code), so tests and reference always agree. Families in `HELD_OUT_FAMILIES` are never used
for training rows: held-out tasks come from families the policy never saw.
"""

from __future__ import annotations

from thermik.tasks.repo_repair.templates import bank, geometry, grades, intervals, inventory, stats, text
from thermik.tasks.repo_repair.templates.unit import Draw, Unit

FAMILIES: dict[str, dict[str, tuple[Draw, ...]]] = {
    "stats": stats.MODULES,
    "text": text.MODULES,
    "inventory": inventory.MODULES,
    "geometry": geometry.MODULES,
    "intervals": intervals.MODULES,
    "grades": grades.MODULES,
    "bank": bank.MODULES,
}
"""family -> module name -> the units it holds (drawn per package)."""
HELD_OUT_FAMILIES: frozenset[str] = frozenset({"grades", "bank"})
TRAIN_FAMILIES: tuple[str, ...] = tuple(sorted(set(FAMILIES) - HELD_OUT_FAMILIES))

__all__ = ["FAMILIES", "HELD_OUT_FAMILIES", "TRAIN_FAMILIES", "Draw", "Unit", "families_for"]


def families_for(split: str) -> tuple[str, ...]:
    """Training rows come from the train families only; held-out (eval) rows from the held-out families only."""
    return tuple(sorted(HELD_OUT_FAMILIES)) if split == "eval" else TRAIN_FAMILIES

"""A template unit: one function of a repo-repair package, with its description and the calls its tests make."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    name: str
    source: str
    description: str
    calls: tuple[str, ...]
    """Python expressions calling the function (the module's other names are in scope)."""


Draw = Callable[[random.Random], Unit]


def unit(name: str, source: str, description: str, *calls: str) -> Unit:
    return Unit(name, source.strip() + "\n", description, calls)

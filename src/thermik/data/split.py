"""Train/eval disjointness: each problem's text is hashed into a split (1 in EVAL_BUCKETS goes to eval).

So any seed of "train" never meets any seed of "eval". `draw_problems` draws distinct problems of one split.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Literal

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
EVAL_BUCKETS = 10
"""One problem in EVAL_BUCKETS (by hash) belongs to the eval split."""


def split_of(problem: str) -> Split:
    """The split a problem text belongs to (stable across runs and platforms)."""
    digest = hashlib.sha256(problem.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0 else "train"


def draw_problems(problem: Callable[[random.Random], str], name: str, n: int, seed: int, split: Split) -> list[str]:
    """`n` distinct problem texts of `split`, deterministic in (name, n, seed, split); `name` labels the stream."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{name}/{split}/{seed}")
    problems: dict[str, None] = {}  # insertion-ordered set
    attempts, max_attempts = 0, 100 * n + 1000
    while len(problems) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"could only find {len(problems)} distinct {split} problems for {name!r}, asked {n}")
        candidate = problem(rng)
        if split_of(candidate) == split:
            problems[candidate] = None
    return list(problems)

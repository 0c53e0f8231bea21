"""A resumable prompt sampler: epochs of seeded shuffles, position saved in checkpoints."""

from __future__ import annotations

import random
from typing import Any


class PromptSampler:
    def __init__(self, rows: list[dict[str, Any]], seed: int) -> None:
        if not rows:
            raise ValueError("the training dataset is empty; point data.train_path at a file with rows")
        self.rows, self.seed = rows, seed
        self.position = 0  # rows handed out so far, across epochs

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.rows))
            out.append(self.rows[self._order(epoch)[i]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])

"""When `thermik sft` checks held-out success, and when it stops (docs/sft.md, "Held-out checks").

Checks run every `eval_every` steps from `min_steps`. Once a check reaches `eval_every_step_from`, they run after
every step: a metric that climbs by a large amount within a few steps (a small model learning to copy) is then
stopped within one step of crossing `stop_at`, not up to `eval_every` steps past it. The run stops at the first
check at or above `stop_at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thermik.config.schema import SFTConfig


@dataclass
class HeldOutStop:
    stop_at: float
    every: int  # 0: no checks at all
    min_step: int = 0
    every_step_from: float = 1.1
    last: float | None = None  # the latest check's value
    every_step: bool = False  # a check has reached every_step_from

    @classmethod
    def from_config(cls, cfg: SFTConfig) -> HeldOutStop:
        return cls(cfg.stop_at, cfg.eval_every, cfg.min_steps, cfg.eval_every_step_from)

    def checks_at(self, step: int) -> bool:
        """Whether the check runs after `step` optimizer steps."""
        if not self.every or step < self.min_step:
            return False
        return self.every_step or step % self.every == 0

    def record(self, value: float) -> None:
        self.last = value
        self.every_step = self.every_step or value >= self.every_step_from

    def reached(self) -> bool:
        return self.last is not None and self.last >= self.stop_at

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run checks at the same steps."""
        return {"every_step": self.every_step}

    def load(self, state: dict[str, Any]) -> None:
        self.every_step = bool(state.get("every_step", False))

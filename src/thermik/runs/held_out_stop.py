"""When `thermik sft` checks held-out success, and when it stops (docs/sft.md, "Held-out checks").

Checks run every `eval_every` steps from `min_steps`. Once a check reaches `eval_every_step_from`, they run after
every step: a metric that climbs by a large amount within a few steps (a small model learning to copy) is then
stopped within a step or two of crossing `stop_at`, not up to `eval_every` steps past it. The run stops once the
mean of the last `stop_window` checks (all of them while fewer have run) reaches `stop_at`: with checks after every
step, a single sampled check that lands above the threshold by chance would otherwise end a run that has not got
there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thermik.config.schema import SFTConfig


@dataclass
class HeldOutStop:
    stop_at: float
    every: int  # 0: no checks at all
    min_step: int = 0
    every_step_from: float = 1.1
    window: int = 1
    recent: list[float] = field(default_factory=list)  # the last `window` checks' values
    every_step: bool = False  # a check has reached every_step_from

    @classmethod
    def from_config(cls, cfg: SFTConfig) -> HeldOutStop:
        return cls(cfg.stop_at, cfg.eval_every, cfg.min_steps, cfg.eval_every_step_from, cfg.stop_window)

    def checks_at(self, step: int) -> bool:
        """Whether the check runs after `step` optimizer steps."""
        if not self.every or step < self.min_step:
            return False
        return self.every_step or step % self.every == 0

    def record(self, value: float) -> None:
        self.recent = [*self.recent, value][-self.window :]
        self.every_step = self.every_step or value >= self.every_step_from

    def mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def reached(self) -> bool:
        mean = self.mean()
        return mean is not None and mean >= self.stop_at

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run checks at the same steps and stops at the same one."""
        return {"every_step": self.every_step, "recent": self.recent}

    def load(self, state: dict[str, Any]) -> None:
        self.every_step = bool(state.get("every_step", False))
        self.recent = [float(v) for v in state.get("recent", [])][-self.window :]

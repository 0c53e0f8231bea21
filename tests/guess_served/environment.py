"""The guessing env whose step() is annotated with the base Action (as some OpenEnv examples are) and checks the
type itself."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action
from openenv_guess import GuessAction, GuessObservation, PlainGuessEnv


class ServedGuessEnv(PlainGuessEnv):
    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        if not isinstance(action, GuessAction):
            raise TypeError(f"expected a GuessAction, got {type(action).__name__}")
        return super().step(action, timeout_s, **kwargs)

"""A small OpenEnv environment for the tests (and docs/environments.md): guess a number from 1 to 8.

`python -m uvicorn openenv_guess:app --port P` (with this folder on PYTHONPATH) serves it through OpenEnv's own
create_fastapi_app; `openenv:openenv_guess:GuessEnv` runs it in-process. Reset(seed) draws the number; each guess
gets "higher", "lower" or "correct" (reward 1, done). `PlainGuessEnv` is the same game declared as OpenEnv's own
examples declare theirs: `Environment` without generic parameters, the action type in step()'s annotation (a string
here, under `from __future__ import annotations`); `plain_app` serves it.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    feedback: str


class PlainGuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target, self._state = 0, State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target, self._state = random.Random(seed).randint(1, 8), State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess a number from 1 to 8.", reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(feedback="correct", done=True, reward=1.0)
        return GuessObservation(feedback="higher" if action.guess < self.target else "lower", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class GuessEnv(PlainGuessEnv, Environment[GuessAction, GuessObservation, State]):
    """The same game with its types declared as generic parameters."""


app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=64)
plain_app = create_fastapi_app(PlainGuessEnv, GuessAction, GuessObservation, max_concurrent_envs=64)

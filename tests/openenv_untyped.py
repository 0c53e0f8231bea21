"""The guessing env of tests/openenv_guess.py with nothing that names its action type (no generic parameters, an
unannotated step(), no OpenEnv app beside it): in-process it needs `env.openenv.action_class`."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv_guess import GuessAction, GuessObservation, PlainGuessEnv


class UntypedGuessEnv(PlainGuessEnv):
    def step(self, action, timeout_s=None, **kwargs: Any) -> GuessObservation:
        return super().step(action, timeout_s, **kwargs)


schemaless_app = create_fastapi_app(UntypedGuessEnv, GuessAction, GuessObservation, max_concurrent_envs=64)
"""A server that answers no /schema (as a hand-written one may): over the WebSocket, too, the setting names the type."""
schemaless_app.router.routes[:] = [r for r in schemaless_app.router.routes if getattr(r, "path", "") != "/schema"]

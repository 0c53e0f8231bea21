"""The OpenEnv app of guess_served.environment (`uvicorn guess_served.app:app`)."""

from openenv.core.env_server.http_server import create_fastapi_app
from openenv_guess import GuessAction, GuessObservation

from guess_served.environment import ServedGuessEnv

app = create_fastapi_app(ServedGuessEnv, GuessAction, GuessObservation, max_concurrent_envs=64)

"""The capture's episodes: open one (a base URL and a key for a harness), close it (its samples)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from thermik.capture.episode import Episode, EpisodeLimits
from thermik.capture.routes import CaptureRoutes, mount
from thermik.inference.base import InferenceEngine
from thermik.inference.server.app import OpenAIServer
from thermik.inference.server.errors import ApiError
from thermik.models.chat import ChatTokenizer
from thermik.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class EpisodeHandle:
    """What a harness needs: an OpenAI-compatible base URL of its own, a key that also works on the plain /v1
    routes, and the model name to send."""

    id: str
    base_url: str
    api_key: str
    model: str
    reward_url: str
    """POST `{"reward": float, "metrics": {...}}` here to give the episode its reward."""

    def client_config(self) -> dict[str, str]:
        """{base_url, api_key, model}: the keyword arguments of `openai.OpenAI(...)` plus the model to ask for."""
        return {"base_url": self.base_url, "api_key": self.api_key, "model": self.model}

    def environment(self) -> dict[str, str]:
        """OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL / EPISODE_REWARD_URL for a harness run as a
        subprocess."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model,
                "EPISODE_REWARD_URL": self.reward_url}  # fmt: skip


class Capture:
    """Per-episode OpenAI-compatible endpoints over one engine (any `InferenceEngine`: embedded, remote, vLLM).

    `mount(app)` adds the routes to an inference app (`build_app`); `url` is where that app is served (set by
    `serve_capture`, or by whoever serves the app)."""

    def __init__(self, server: OpenAIServer, chat: ChatTokenizer, url: str = "") -> None:
        self.server, self.chat, self.url = server, chat, url
        self._episodes: dict[str, Episode] = {}
        self._keys: dict[str, str] = {}

    @classmethod
    def over(cls, app: FastAPI) -> Capture:
        """The capture of an inference app (`build_app`), mounted on it."""
        server: OpenAIServer = app.state.server
        capture = cls(server, ChatTokenizer(server.tokenizer))
        capture.mount(app)
        return capture

    def mount(self, app: FastAPI) -> None:
        mount(app, CaptureRoutes(self))
        app.state.capture = self

    # ------------------------------------------------------------------ the in-process API

    def open(self, limits: EpisodeLimits | None = None, group_id: int = 0) -> EpisodeHandle:
        """A new episode; its samples come back from `close`."""
        episode = Episode(self.chat, limits or EpisodeLimits(), group_id)
        self._episodes[episode.id] = episode
        self._keys[episode.api_key] = episode.id
        root = f"{self.url}/episodes/{episode.id}"
        return EpisodeHandle(episode.id, f"{root}/v1", episode.api_key, self.server.model_name, f"{root}/reward")

    def close(self, episode_id: str) -> Trajectory:
        """End the episode (its URL and key answer 404 from now on) and return its samples: the first sample, with
        the others as its `continuations` (`env_metrics`: capture_forks, capture_retries)."""
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            raise KeyError(f"no open episode {episode_id!r}")
        self._keys.pop(episode.api_key, None)
        end = getattr(self.server.engine, "end_session", None)
        if end is not None:
            end(episode.id)
        return episode.trajectory()

    def take_reward(self, episode_id: str) -> tuple[float | None, dict[str, float]]:
        """The reward and metrics posted to the open episode's reward URL (None: none posted), taken off it: `close`
        then places nothing, for a caller that weighs the posted reward against others (agents/outcome.py)."""
        episode = self._episodes[episode_id]
        taken = episode.reward, episode.reward_metrics
        episode.reward, episode.reward_metrics = None, {}
        return taken

    # ------------------------------------------------------------------ for the routes

    def episode(self, episode_id: str, finished_too: bool = False) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise ApiError(404, f"episode {episode_id!r} does not exist or was closed", None, "episode_not_found")
        if episode.finished is not None and not finished_too:
            raise ApiError(404, f"episode {episode_id!r} is finished ({episode.finished}): its budget is spent",
                           None, "episode_finished")  # fmt: skip
        return episode

    def id_of_key(self, key: str) -> str | None:
        return self._keys.get(key)


KEEP_ALIVE_S = 75
"""How long the server keeps an idle connection: longer than clients keep theirs (httpx: 5 s), so a harness idle
between turns (a slow tool) drops its pooled connection first, rather than sending on one the server has just
closed (a connection error to an SDK client without retries)."""


@contextlib.asynccontextmanager
async def serve_capture(
    engine: InferenceEngine, tokenizer: Any, model_name: str, max_model_len: int, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[Capture]:
    """The inference app over `engine` with the capture mounted, served by uvicorn in this event loop until the
    block ends (port 0: a free one); yields the capture, its `url` set."""
    import asyncio

    import uvicorn

    from thermik.inference.server.app import build_app

    app = build_app(engine, tokenizer, model_name, max_model_len=max_model_len)
    capture = Capture.over(app)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                            timeout_keep_alive=KEEP_ALIVE_S)  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why the server could not start
        await asyncio.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    capture.url = f"http://{host}:{bound[1]}"
    try:
        yield capture
    finally:
        server.should_exit = True
        await task

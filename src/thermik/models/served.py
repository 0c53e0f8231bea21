"""The model an OpenAI-compatible server serves, from its `/v1/models` list: the name a client sends when its config
names none (the teacher's `algorithm.teacher.model`, the judge's `rewards.judge.model`)."""

from __future__ import annotations

import httpx

from thermik.errors import ThermikError

BODY_CHARS = 300  # of a refusal's body, quoted in messages


class NoServedModelError(ThermikError):
    """The server's /v1/models answered, but names no model to send."""


async def first_served_model(client: httpx.AsyncClient, base_url: str, setting: str) -> str:
    """The id of the first model `base_url`/v1/models lists. A server that does not answer raises httpx's transport
    error (the caller decides whether that is fatal); an error status or an empty list raises NoServedModelError
    naming `setting`, the config key that would name the model instead."""
    url = f"{base_url.rstrip('/')}/v1/models"
    reply = await client.get(url)
    if reply.status_code != 200:
        raise NoServedModelError(
            f"{setting} is empty and GET {url} answered {reply.status_code}: {reply.text[:BODY_CHARS]}",
            hint=f"set {setting} to the model the server serves",
        )
    try:
        return str(reply.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise NoServedModelError(
            f"{setting} is empty and GET {url} lists no model: {reply.text[:BODY_CHARS]}",
            hint=f"set {setting} to the model the server serves",
        ) from None

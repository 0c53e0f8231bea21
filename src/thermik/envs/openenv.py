"""OpenEnv environments inside thermik's loop: `openenv:pkg.mod:Class` in-process, `openenv+ws://host:port` remote.

An episode resets its own environment (in-process: a fresh instance; remote: its own WebSocket session, since
OpenEnv's HTTP /reset and /step build a fresh environment per call) and appends the reset observation to the row's
prompt. Each reply becomes an Action: the value of the action schema's single required field (or
`env.openenv.action_field`), else the reply parsed as a JSON object. Each Observation becomes one message, with
the step's reward and done. A refused action (invalid, or the environment raised on it) becomes an `error: `
observation and the episode goes on; a lost connection or a failed reset ends the episode with reward 0 and
`env_error` in the step's metadata. docs/environments.md, "OpenEnv".

The remote client speaks OpenEnv's WebSocket messages ({"type": "reset" | "step" | "close", "data": ...}; replies
{"type": "observation", "data": {"observation", "reward", "done"}} or {"type": "error", ...}) with `websockets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import typing
from typing import Any, ClassVar, Protocol

from thermik.config.schema import EnvConfig, OpenEnvConfig
from thermik.envs.base import Env, Message, StepOutput

INPROCESS_PREFIX = "openenv:"
REMOTE_PREFIX = "openenv+ws://"
_NOT_OBSERVED = {"done", "reward", "metadata"}


class EnvGone(Exception):
    """The environment cannot go on with this episode (a lost connection, a failed reset)."""


class ActionRefused(Exception):
    """The environment refused one action; the episode goes on."""


def _openenv() -> Any:
    try:
        from openenv.core.env_server import interfaces, types
    except ImportError as exc:
        raise ValueError(
            f"in-process OpenEnv environments need openenv-core ({exc}); install it with "
            "`pip install 'thermik[openenv]'`"
        ) from exc
    return interfaces, types


def _websockets() -> Any:
    try:
        from websockets.asyncio import client
    except ImportError as exc:
        raise ValueError(
            f"remote OpenEnv environments need the websockets package ({exc}); install it with "
            "`pip install 'thermik[openenv]'`"
        ) from exc
    return client


def action_field(schema: dict[str, Any], cfg: OpenEnvConfig) -> str | None:
    """The field a reply fills: the configured one, else the schema's single required field, else None (JSON)."""
    if cfg.action_field:
        return cfg.action_field
    required = [name for name in schema.get("required", []) if name != "metadata"]
    return required[0] if len(required) == 1 else None


def parse_action(text: str, schema: dict[str, Any], cfg: OpenEnvConfig) -> dict[str, Any]:
    """The Action fields a reply stands for; ActionRefused names what the environment expects."""
    field = action_field(schema, cfg)
    text = text.strip()
    if field is not None:
        kind = schema.get("properties", {}).get(field, {}).get("type")
        if kind in (None, "string"):
            return {field: text}
        try:
            return {field: json.loads(text)}
        except json.JSONDecodeError:
            raise ActionRefused(f"field {field!r} needs a JSON {kind}, got {text[:80]!r}") from None
    try:
        action = json.loads(text[text.find("{") : text.rfind("}") + 1] if "{" in text else text)
    except json.JSONDecodeError:
        action = None
    if not isinstance(action, dict):
        fields = ", ".join(schema.get("properties", {})) or "none"
        raise ActionRefused(f"reply with the action as a JSON object (fields: {fields}), got {text[:80]!r}")
    return action


def observation_message(observation: dict[str, Any], cfg: OpenEnvConfig) -> Message:
    """One observation as a chat message: the configured field as text, else the fields as JSON."""
    shown = {k: v for k, v in observation.items() if k not in _NOT_OBSERVED}
    if cfg.observation_field:
        content = shown.get(cfg.observation_field, "")
        content = content if isinstance(content, str) else json.dumps(content)
    else:
        content = json.dumps(shown, sort_keys=True)
    return {"role": cfg.observation_role, "content": content}


class Backend(Protocol):
    """One episode's environment: reset and step answer {"observation", "reward", "done"}."""

    async def reset(self, kwargs: dict[str, Any]) -> dict[str, Any]: ...
    async def step(self, action: dict[str, Any]) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class InProcess:
    """A fresh instance of an OpenEnv `Environment` subclass in this process."""

    def __init__(self, env_cls: type, action_cls: type) -> None:
        self.env, self.action_cls = env_cls(), action_cls

    async def reset(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return _payload(await self.env.reset_async(**kwargs))
        except Exception as exc:  # the environment's own failure: this episode cannot start
            raise EnvGone(f"reset failed: {type(exc).__name__}: {exc}") from exc

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = self.action_cls.model_validate(action)
        except ValueError as exc:  # pydantic's ValidationError
            raise ActionRefused(f"invalid action: {exc}") from None
        try:
            return _payload(await self.env.step_async(parsed))
        except Exception as exc:  # as OpenEnv's server does: the step's error is reported, the session lives on
            raise ActionRefused(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        self.env.close()


def _payload(observation: Any) -> dict[str, Any]:
    fields = observation.model_dump(exclude=_NOT_OBSERVED)
    return {"observation": fields, "reward": observation.reward, "done": observation.done}


class Remote:
    """One WebSocket session on an OpenEnv server (`create_fastapi_app`'s /ws)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s, self.ws = url, timeout_s, None

    async def _request(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.ws is None:
                self.ws = await _websockets().connect(self.url, open_timeout=self.timeout_s, max_size=None)
            await self.ws.send(json.dumps({"type": kind, "data": data}))
            reply = json.loads(await asyncio.wait_for(self.ws.recv(), self.timeout_s))
        except (OSError, TimeoutError, json.JSONDecodeError) as exc:
            raise EnvGone(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # websockets' ConnectionClosed and handshake errors
            if type(exc).__module__.startswith("websockets"):
                raise EnvGone(f"{self.url}: {type(exc).__name__}: {exc}") from exc
            raise
        if reply.get("type") == "error":
            error = reply.get("data") or {}
            message = f"{error.get('message', 'error')} ({error.get('code', '?')}): {error.get('errors', '')}"
            raise (ActionRefused if kind == "step" else EnvGone)(message.rstrip(": "))
        return reply.get("data") or {}

    async def reset(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return await self._request("reset", kwargs)

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return await self._request("step", action)

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):  # the server may be gone: closing is best effort
                await self.ws.send(json.dumps({"type": "close"}))
                await self.ws.close()
            self.ws = None


class OpenEnvEnv(Env):
    """Base of the classes `openenv_env_class` / `remote_env_class` build; one instance plays one episode."""

    action_schema: ClassVar[dict[str, Any]] = {}

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        self.cfg = options.openenv
        self.reset_kwargs = {**self.cfg.reset, **(extra_info.get("reset") or {})}
        self.backend: Backend | None = None
        self.error: str | None = None

    def open_backend(self) -> Backend:
        raise TypeError("build OpenEnv environments with make('openenv:pkg.mod:Class' or 'openenv+ws://host:port')")

    async def ainit(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        self.backend = self.open_backend()
        try:
            payload = await self.backend.reset(self.reset_kwargs)
        except EnvGone as exc:  # the first step ends the episode; the prompt shows why
            self.error = str(exc)
            return [*prompt, {"role": self.cfg.observation_role, "content": f"error: {exc}"}], {}
        return [*prompt, observation_message(payload.get("observation") or {}, self.cfg)], {}

    async def astep(self, action: str) -> StepOutput:
        if self.error is not None or self.backend is None:
            return StepOutput([], 0.0, True, {"env_error": self.error or "the environment was not reset"})
        try:
            payload = await self.backend.step(parse_action(action, self.action_schema, self.cfg))
        except ActionRefused as exc:
            error = {"role": self.cfg.observation_role, "content": f"error: {exc}"}
            return StepOutput([error], 0.0, False, {"action_error": str(exc)})
        except EnvGone as exc:
            self.error = str(exc)
            return StepOutput([], 0.0, True, {"env_error": self.error})
        done, reward = bool(payload.get("done")), float(payload.get("reward") or 0.0)
        observations = [] if done else [observation_message(payload.get("observation") or {}, self.cfg)]
        return StepOutput(observations, reward, done, {})

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.close()


@functools.cache
def openenv_env_class(path: str) -> type[Env]:
    """`openenv:pkg.mod:Class`: an OpenEnv Environment subclass run in this process."""
    interfaces, types = _openenv()
    module_name, _, attr = path.partition(":")
    try:
        env_cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"openenv:{path}: cannot import {attr!r} from {module_name!r}: {exc}") from exc
    if not (isinstance(env_cls, type) and issubclass(env_cls, interfaces.Environment)):
        raise ValueError(f"openenv:{path} is not a subclass of openenv's Environment")
    action_cls = _action_class(env_cls, types.Action, path)

    def open_backend(self: OpenEnvEnv) -> Backend:
        return InProcess(env_cls, action_cls)

    schema = action_cls.model_json_schema()
    return type(f"OpenEnv_{attr}", (OpenEnvEnv,), {"action_schema": schema, "open_backend": open_backend})


def _action_class(env_cls: type, action_base: type, path: str) -> type:
    """The Action type of `Environment[Action, Observation, State]` in the class's bases."""
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            for arg in typing.get_args(base):
                if isinstance(arg, type) and issubclass(arg, action_base):
                    return arg
    raise ValueError(f"openenv:{path}: declare its action type: class {env_cls.__name__}(Environment[A, O, S])")


@functools.cache
def remote_env_class(address: str) -> type[Env]:
    """`openenv+ws://host:port`: an OpenEnv server's environment, one WebSocket session per episode."""
    import httpx

    _websockets()  # fail before the first episode when the client is missing
    base = f"http://{address.rstrip('/')}"
    try:
        schema = httpx.get(f"{base}/schema", timeout=10.0).raise_for_status().json()["action"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        port = address.rpartition(":")[2] or "8000"
        raise ValueError(
            f"no OpenEnv server answers at {base} ({type(exc).__name__}: {exc}); start the environment's server first, "
            f"e.g. `uvicorn my_env.server.app:app --host 127.0.0.1 --port {port}` (an app from OpenEnv's "
            "create_fastapi_app), or fix env.name"
        ) from exc
    url = f"ws://{address.rstrip('/')}/ws"

    def open_backend(self: OpenEnvEnv) -> Backend:
        return Remote(url, self.cfg.timeout_s)

    return type("OpenEnvRemote", (OpenEnvEnv,), {"action_schema": schema, "open_backend": open_backend})

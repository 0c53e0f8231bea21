"""OpenEnv environments inside thermik's loop: `openenv:pkg.mod:Class` in-process, `openenv+ws://host:port` remote
(`openenv+wss://` over TLS).

An episode resets its own environment (in-process: a fresh instance; remote: its own WebSocket session, since
OpenEnv's HTTP /reset and /step build a fresh environment per call) and appends the reset observation to the row's
prompt. Each reply becomes an Action: the value of the action schema's single required field (or
`env.openenv.action_field`), else the reply parsed as a JSON object. Each Observation becomes one message, with
the step's reward and done. A refused action (invalid, or the environment raised on it) becomes an `error: `
observation and the episode goes on; a lost connection or a failed reset ends the episode with reward 0 and
`env_error` in the step's metadata. The action type comes from the environment's declaration, its server's
/schema or `env.openenv.action_class` (envs/openenv_action.py). docs/environments.md, "OpenEnv".

The remote client speaks OpenEnv's WebSocket messages ({"type": "reset" | "step" | "close", "data": ...}; replies
{"type": "observation", "data": {"observation", "reward", "done"}} or {"type": "error", ...}) with `websockets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from thermik.config.schema import EnvConfig, OpenEnvConfig
from thermik.envs import openenv_action
from thermik.envs.base import Env, Message, StepOutput
from thermik.envs.openenv_action import OpenEnvSetupError

_NOT_OBSERVED = {"done", "reward", "metadata"}


class EnvGone(Exception):
    """The environment cannot go on with this episode (a lost connection, a failed reset)."""


class ActionRefused(Exception):
    """The environment refused one action; the episode goes on."""


def _openenv() -> Any:
    try:
        from openenv.core.env_server import interfaces, types
    except ImportError as exc:
        raise OpenEnvSetupError(
            f"in-process OpenEnv environments need openenv-core ({exc}); install it with "
            "`pip install 'thermik[openenv]'`"
        ) from exc
    return interfaces, types


def _websockets() -> Any:
    try:
        from websockets.asyncio import client
    except ImportError as exc:
        raise OpenEnvSetupError(
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

    def __init__(self, url: str, timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        self.url, self.timeout_s, self.tls, self.ws = url, timeout_s, tls, None

    async def _request(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.ws is None:
                tls = {} if self.tls is None else {"ssl": self.tls}
                self.ws = await _websockets().connect(self.url, open_timeout=self.timeout_s, max_size=None, **tls)
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


@dataclass(frozen=True)
class Binding:
    """What the episodes of one environment share: its action schema and how an episode opens its backend."""

    action_schema: dict[str, Any]
    open_backend: Callable[[OpenEnvConfig], Backend]


class OpenEnvEnv(Env):
    """Base of the classes `openenv_env_class` / `remote_env_class` build; one instance plays one episode."""

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        self.cfg = options.openenv
        self.binding = self.bind(self.cfg)
        self.reset_kwargs = {**self.cfg.reset, **(extra_info.get("reset") or {})}
        self.backend: Backend | None = None
        self.error: str | None = None

    @classmethod
    def bind(cls, cfg: OpenEnvConfig) -> Binding:
        raise TypeError("build OpenEnv environments with make('openenv:pkg.mod:Class' or 'openenv+ws://host:port')")

    async def ainit(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        self.backend = self.binding.open_backend(self.cfg)
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
            payload = await self.backend.step(parse_action(action, self.binding.action_schema, self.cfg))
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
    interfaces, _ = _openenv()
    module_name, _, attr = path.partition(":")
    try:
        env_cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OpenEnvSetupError(f"openenv:{path}: cannot import {attr!r} from {module_name!r}: {exc}") from exc
    if not (isinstance(env_cls, type) and issubclass(env_cls, interfaces.Environment)):
        raise OpenEnvSetupError(f"openenv:{path} is not a subclass of openenv's Environment")

    def bind(cls: type[OpenEnvEnv], cfg: OpenEnvConfig) -> Binding:
        return _in_process_binding(env_cls, path, cfg.action_class)

    return type(f"OpenEnv_{attr}", (OpenEnvEnv,), {"bind": classmethod(bind)})


@functools.cache
def _in_process_binding(env_cls: type, path: str, action_spec: str) -> Binding:
    action_cls = openenv_action.action_class(env_cls, _openenv()[1].Action, action_spec, f"openenv:{path}")
    return Binding(action_cls.model_json_schema(), lambda cfg: InProcess(env_cls, action_cls))


def remote_env_class(address: str) -> type[Env]:
    """`openenv+ws://host:port`: an OpenEnv server's environment, one WebSocket session per episode."""
    return _remote_env_class("ws", address.rstrip("/"))


def secure_env_class(address: str) -> type[Env]:
    """`openenv+wss://host:port`: the same over TLS (the certificate checked against env.openenv.ca_file)."""
    return _remote_env_class("wss", address.rstrip("/"))


@functools.cache
def _remote_env_class(scheme: str, address: str) -> type[Env]:
    _websockets()  # fail before the first episode when the client is missing

    def bind(cls: type[OpenEnvEnv], cfg: OpenEnvConfig) -> Binding:
        return _remote_binding(scheme, address, cfg.action_class, cfg.ca_file, cfg.timeout_s)

    return type("OpenEnvRemote", (OpenEnvEnv,), {"bind": classmethod(bind)})


@functools.cache
def _remote_binding(scheme: str, address: str, action_spec: str, ca_file: str, timeout_s: float) -> Binding:
    tls = _tls_context(ca_file) if scheme == "wss" else None
    base = f"{'https' if tls else 'http'}://{address}"
    schema = openenv_action.schema_of_setting(action_spec, _served_schema(base, tls, timeout_s), f"openenv+{base}")
    if schema is None:
        raise OpenEnvSetupError(
            f"the OpenEnv server at {base} serves no action schema at /schema",
            hint=f"set --{openenv_action.SETTING} pkg.mod:MyAction",
        )
    url = f"{scheme}://{address}/ws"
    return Binding(schema, lambda cfg: Remote(url, cfg.timeout_s, tls))


def _served_schema(base: str, tls: ssl.SSLContext | None, timeout_s: float) -> dict[str, Any] | None:
    """The server's action schema; None when it answers without one; no answer at all is an error."""
    import httpx

    try:
        with httpx.Client(verify=tls or True, timeout=timeout_s) as client:
            reply = client.get(f"{base}/schema")
    except httpx.HTTPError as exc:
        port = base.rpartition(":")[2] or "8000"
        raise OpenEnvSetupError(
            f"no OpenEnv server answers at {base} ({type(exc).__name__}: {exc})",
            hint=f"start the environment's server first, e.g. `uvicorn my_env.server.app:app --host 127.0.0.1 --port "
            f"{port}` (an app from OpenEnv's create_fastapi_app), or fix env.name"
            + ("; a server certificate the system does not trust needs --env.openenv.ca_file" if tls else ""),
        ) from exc
    try:
        schema = reply.json().get("action") if reply.status_code == 200 else None
    except ValueError:
        schema = None
    return schema if isinstance(schema, dict) else None


def _tls_context(ca_file: str) -> ssl.SSLContext:
    """The client's TLS context: the system's trust (SSL_CERT_FILE honoured), or the authorities in `ca_file`."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise OpenEnvSetupError(f"env.openenv.ca_file = {ca_file!r}: cannot load it ({exc})") from exc

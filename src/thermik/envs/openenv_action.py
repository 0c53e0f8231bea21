"""Where an OpenEnv environment's Action type comes from, in this order (docs/environments.md, "OpenEnv"):

1. the generic parameters: `class MyEnv(Environment[MyAction, MyObservation, State])`;
2. the annotation of `step()`'s action parameter, as OpenEnv's own examples write it: `class MyEnv(Environment)`
   with `def step(self, action: MyAction)` (string annotations resolved with typing.get_type_hints);
3. the server's `/schema`: over the WebSocket, the server's own; in-process, that of the OpenEnv app beside the
   class (an `app` in its module, or the `app` module of its package: OpenEnv's `my_env/server/app.py`), asked in
   this process, its action schema matched to an Action class of those modules;
4. the setting `env.openenv.action_class = "pkg.mod:Class"`.

The base `Action` itself names nothing (an env whose step takes any Action and checks its type). A setting that
names another class than the one the environment declares is refused rather than ignored.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import typing
from types import ModuleType
from typing import Any

from thermik.errors import ThermikError

SETTING = "env.openenv.action_class"


class OpenEnvSetupError(ThermikError, ValueError):
    """An OpenEnv environment thermik cannot set up as configured (its name, its action type, its server)."""


def from_generics(env_cls: type, base: type) -> type | None:
    """The Action type of `Environment[Action, Observation, State]` in the class's bases."""
    for klass in env_cls.__mro__:
        for generic in getattr(klass, "__orig_bases__", ()):
            found = _action_in(typing.get_args(generic), base)
            if found is not None:
                return found
    return None


def from_step(env_cls: type, base: type) -> type | None:
    """The annotation of step()'s first parameter after self, when it names an Action subclass (or a union of one)."""
    step = getattr(env_cls, "step", None)
    try:
        params = [p for p in inspect.signature(step).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not params:
        return None
    try:
        annotation = typing.get_type_hints(step).get(params[0].name)
    except Exception:  # a name only imported under TYPE_CHECKING, or any other unresolvable annotation
        return None
    return _action_in((annotation, *typing.get_args(annotation)), base)


def from_app(env_cls: type, base: type) -> type | None:
    """The Action class whose JSON schema the OpenEnv app beside `env_cls` serves at /schema."""
    module = sys.modules[env_cls.__module__]
    for place in (module, _sibling_app_module(module)):
        app = getattr(place, "app", None) if place is not None else None
        schema = _served_action_schema(app) if app is not None else None
        if schema is None:
            continue
        candidates = {obj for m in (module, place) for obj in vars(m).values() if _is_action(obj, base)}
        matches = [c for c in candidates if c.model_json_schema() == schema]
        if len(matches) == 1:
            return matches[0]
    return None


def from_setting(spec: str, base: type) -> type | None:
    """The class `env.openenv.action_class` names; None when it is empty."""
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    try:
        if not sep or not module_name or not attr:
            raise ValueError("it must look like 'pkg.mod:Class'")
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OpenEnvSetupError(f"{SETTING} = {spec!r}: cannot import it ({type(exc).__name__}: {exc})") from exc
    if not (isinstance(found, type) and issubclass(found, base)):
        raise OpenEnvSetupError(f"{SETTING} = {spec!r} is not a subclass of {base.__module__}.{base.__name__}")
    return found


def action_class(env_cls: type, base: type, spec: str, name: str) -> type:
    """The Action class of an in-process environment (the module docstring's order)."""
    configured = from_setting(spec, base)
    for how, find in (("its generic parameters", from_generics), ("the annotation of its step()", from_step),
                      ("its OpenEnv app's /schema", from_app)):  # fmt: skip
        found = find(env_cls, base)
        if found is None:
            continue
        if configured is not None and configured is not found:
            raise OpenEnvSetupError(
                f"{name}: {SETTING} = {spec!r}, but {env_cls.__name__} names {found.__module__}.{found.__name__} "
                f"({how}); drop the setting"
            )
        return found
    if configured is not None:
        return configured
    raise OpenEnvSetupError(
        f"{name}: cannot tell {env_cls.__name__}'s action type: neither Environment[A, O, S], nor step()'s "
        "annotation, nor an OpenEnv app beside it names one",
        hint=f"annotate `def step(self, action: MyAction)` or set --{SETTING} pkg.mod:MyAction",
    )


def schema_of_setting(spec: str, server_schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """A remote environment's action schema from the setting: checked against the server's when it serves one."""
    from pydantic import BaseModel

    configured = from_setting(spec, BaseModel)
    if configured is None:
        return server_schema
    schema = configured.model_json_schema()
    if server_schema is not None and schema != server_schema:
        raise OpenEnvSetupError(
            f"{name}: {SETTING} = {spec!r} is not the action the server's /schema describes "
            f"({server_schema.get('title', '?')}); drop the setting"
        )
    return schema


def _action_in(candidates: tuple[Any, ...], base: type) -> type | None:
    found = [c for c in candidates if _is_action(c, base)]
    return found[0] if len(found) == 1 else None


def _is_action(obj: Any, base: type) -> bool:
    return isinstance(obj, type) and issubclass(obj, base) and obj is not base


def _sibling_app_module(module: ModuleType) -> ModuleType | None:
    """`pkg.app` for a class in `pkg.mod` (OpenEnv's layout: server/my_environment.py beside server/app.py)."""
    package = module.__name__.rpartition(".")[0]
    name = f"{package}.app"
    if not package or name == module.__name__:
        return None
    try:
        return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None
    except Exception:  # an app module that fails to import serves nothing here
        return None


def _served_action_schema(app: Any) -> dict[str, Any] | None:
    """The action schema an ASGI app answers at /schema, asked in this process; None when it answers none."""
    if not callable(app):
        return None
    from starlette.testclient import TestClient

    try:
        reply = TestClient(app, raise_server_exceptions=False).get("/schema")
        schema = reply.json().get("action") if reply.status_code == 200 else None
    except Exception:  # not an app that serves /schema
        return None
    return schema if isinstance(schema, dict) else None

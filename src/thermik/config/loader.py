"""Resolve a typed config from TOML files, environment variables and CLI flags.

Precedence, lowest first: model defaults < TOML files (left to right, tables deep-merged)
< `THERMIK_SECTION__KEY` environment variables < `--section.key value` flags.

Every key is checked against the model before pydantic runs, so a typo fails at once with
the full dotted key and the closest valid names (docs/architecture.md, invariant 4). This module imports
only the standard library and pydantic: it must stay fast and never pull in torch.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from thermik.errors import ThermikError

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "THERMIK_"
# THERMIK_* switches read at run time, not config keys: the CPU kernels (cpu/kernels.py), the simulated CPU
# (cpu/isa.py), "auto" pinned to float32 (cpu/engine_precision.py) and tracebacks for user errors (cli.py, `--debug`).
RUNTIME_VARIABLES = frozenset({"THERMIK_CPU_KERNELS", "THERMIK_CPU_ISA", "THERMIK_AUTO_PRECISION", "THERMIK_DEBUG"})
_HELP_FLAGS = ("-h", "--help")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(ThermikError, ValueError):
    """A config key or value is wrong; the message names the dotted key and the fix."""

    exit_code = 2


# ---------------------------------------------------------------------------------------
# Model introspection


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel a field nests (also through `X | None`), or None for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for m in (_section_model(a) for a in get_args(annotation)) if m is not None]
        if len(models) == 1:
            return models[0]
    return None


def _is_string_field(annotation: Any) -> bool:
    """True when a CLI/env value for this field should be kept verbatim, never TOML-parsed."""
    if annotation in (str, Path):
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return bool(args) and all(_is_string_field(a) for a in args)
    return False


def _unknown_key(model_cls: type[BaseModel], prefix: str, key: str, source: str) -> ConfigError:
    names = list(model_cls.model_fields)
    full = f"{prefix}{key}"
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    where = f"section '{prefix[:-1]}'" if prefix else "the top level"
    hint = f" Did you mean {', '.join(repr(prefix + c) for c in close)}?" if close else ""
    return ConfigError(
        f"unknown config key '{full}' (from {source}).{hint} Valid keys in {where}: {', '.join(names)}. "
        "Run with --help to list every key."
    )


def _resolve_path(model_cls: type[BaseModel], path: list[str], source: str) -> Any:
    """Check a dotted path against the model; return the annotation of its leaf field."""
    current: type[BaseModel] | None = model_cls
    prefix = ""
    annotation: Any = None
    for i, key in enumerate(path):
        if current is None:
            raise ConfigError(
                f"'{prefix[:-1]}' is a value, not a section: '{'.'.join(path)}' is not a config key (from {source})."
            )
        field = current.model_fields.get(key)
        if field is None:
            raise _unknown_key(current, prefix, key, source)
        annotation = field.annotation
        current = _section_model(annotation)
        prefix += key + "."
        if i == len(path) - 1 and current is not None:
            raise ConfigError(
                f"'{'.'.join(path)}' is a section, not a value (from {source}); set its keys, "
                f"e.g. --{'.'.join(path)}.{next(iter(current.model_fields))} VALUE."
            )
    return annotation


def _check_table(model_cls: type[BaseModel], table: Mapping[str, Any], prefix: str, source: str) -> None:
    """Check every key of a (TOML) table against the model, recursing into sections."""
    for key, value in table.items():
        field = model_cls.model_fields.get(key)
        if field is None:
            raise _unknown_key(model_cls, prefix, key, source)
        sub = _section_model(field.annotation)
        if sub is not None and isinstance(value, Mapping):
            _check_table(sub, value, f"{prefix}{key}.", source)


# ---------------------------------------------------------------------------------------
# Sources: TOML files, environment, CLI


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _leaf_sources(table: Mapping[str, Any], prefix: str, source: str, out: dict[str, str]) -> None:
    for key, value in table.items():
        if isinstance(value, Mapping):
            _leaf_sources(value, f"{prefix}{key}.", source, out)
        else:
            out[f"{prefix}{key}"] = source


def _read_toml(path_str: str) -> dict[str, Any]:
    path = Path(path_str)
    if not path.is_file():
        raise ConfigError(f"config file not found: '{path_str}' (given after '@'). Check the path.")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"TOML syntax error in '{path_str}': {e}") from None


def _parse_value(raw: str, annotation: Any) -> Any:
    """Parse a CLI/env value: verbatim for string fields, else as a TOML literal when it is one."""
    if _is_string_field(annotation):
        return raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _split_argv(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Split argv into TOML file paths and (dotted key, raw value) overrides, in order."""
    files: list[str] = []
    flags: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "@":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError("'@' must be followed by a TOML file path, e.g. '@ configs/run.toml'.")
            files.append(argv[i + 1])
            i += 2
        elif tok.startswith("@"):
            files.append(tok[1:])
            i += 1
        elif tok.startswith("--") and len(tok) > 2:
            key, eq, value = tok[2:].partition("=")
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--") or argv[i + 1].startswith("@"):
                    raise ConfigError(f"flag '--{key}' has no value; write '--{key} VALUE' or '--{key}=VALUE'.")
                value = argv[i + 1]
                i += 1
            flags.append((key, value))
            i += 1
        else:
            raise ConfigError(
                f"unexpected argument '{tok}': use '@ FILE.toml' for config files and '--section.key VALUE' "
                "for overrides."
            )
    return files, flags


def _env_overrides(env: Mapping[str, str]) -> list[tuple[list[str], str, str]]:
    out = []
    for name, value in sorted(env.items()):
        is_config = name.upper() not in RUNTIME_VARIABLES and name[: len(ENV_PREFIX)].upper() == ENV_PREFIX
        if len(name) > len(ENV_PREFIX) and is_config:
            path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
            out.append((path, value, f"environment variable {name}"))
    return out


def _validation_error(e: ValidationError, sources: Mapping[str, str]) -> ConfigError:
    lines = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if key:
            leaf = key
            while leaf and leaf not in sources and "." in leaf:
                leaf = leaf.rsplit(".", 1)[0]
            src = f", from {sources[leaf]}" if leaf in sources else ""
            lines.append(f"{key}: {msg} (got {err['input']!r}{src})")
        else:
            lines.append(msg)
    return ConfigError("invalid config:\n  " + "\n  ".join(lines))


def wants_help(argv: list[str]) -> bool:
    """True when the user asked for `--help` / `-h`."""
    return any(a in _HELP_FLAGS for a in argv)


def _own_keys(
    model_cls: type[BaseModel], shared_with: type[BaseModel] | None, table: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """The top-level keys of `table` that `model_cls` has, after checking the others against `shared_with` (a
    config one file serves together with `model_cls`: `thermik inference @ rl.toml` reads the server's part)."""
    own = {k: v for k, v in table.items() if k in model_cls.model_fields or shared_with is None}
    _check_table(model_cls, own, "", source)
    if shared_with is not None:
        _check_table(shared_with, {k: v for k, v in table.items() if k not in own}, "", source)
    return own


def load_config(
    model_cls: type[M],
    argv: list[str],
    env: Mapping[str, str] | None = None,
    *,
    shared_with: type[BaseModel] | None = None,
) -> M:
    """Build and validate `model_cls` from `@ file.toml` args, THERMIK_* env vars and `--a.b v` flags.

    `env` defaults to `os.environ`; pass `{}` to ignore the environment (tests, reproducible runs).
    Unknown THERMIK_* variables fail like unknown flags: a typo is never silently ignored.
    `shared_with`: keys of this other config that `model_cls` lacks are checked against it, then ignored, so
    one file (and one environment) can configure several processes.
    """
    files, flags = _split_argv(argv)
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path in files:
        table = _own_keys(model_cls, shared_with, _read_toml(path), f"file '{path}'")
        tree = _deep_merge(tree, table)
        _leaf_sources(table, "", f"file '{path}'", sources)
    overrides = _env_overrides(os.environ if env is None else env)
    overrides += [(key.split("."), value, f"flag --{key}") for key, value in flags]
    for path, raw, source in overrides:
        if not all(path):
            raise ConfigError(f"malformed config key '{'.'.join(path)}' (from {source}).")
        if shared_with is not None and path[0] not in model_cls.model_fields:
            _resolve_path(shared_with, path, source)  # another process's key: checked, not used here
            continue
        annotation = _resolve_path(model_cls, path, source)
        _set_path(tree, path, _parse_value(raw, annotation))
        sources[".".join(path)] = source
    try:
        return model_cls.model_validate(tree)
    except ValidationError as e:
        raise _validation_error(e, sources) from None


# ---------------------------------------------------------------------------------------
# Help


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in get_args(annotation)) + "}"
    if origin is not None:
        args = get_args(annotation)
        if origin in (Union, types.UnionType):
            return " | ".join(_type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _defaults(model_cls: type[BaseModel]) -> BaseModel | None:
    try:
        return model_cls()
    except ValidationError:
        return None


def _help_lines(model_cls: type[BaseModel], default: BaseModel | None, prefix: str, out: dict[str, list[str]]) -> None:
    section = prefix[:-1] or "general"
    for name, field in model_cls.model_fields.items():
        value = getattr(default, name) if default is not None else field.get_default(call_default_factory=True)
        sub = _section_model(field.annotation)
        if sub is not None:
            _help_lines(sub, value if isinstance(value, BaseModel) else None, f"{prefix}{name}.", out)
            continue
        shown = "required" if field.is_required() and default is None else f"default={_toml_value(value)}"
        desc = field.description or ""
        out.setdefault(section, []).append(f"  --{prefix}{name}  {_type_name(field.annotation)}  {shown}  {desc}")


def format_help(model_cls: type[BaseModel]) -> str:
    """Every field, recursively, as `--section.key  TYPE  default=...  description`, by section."""
    groups: dict[str, list[str]] = {}
    _help_lines(model_cls, _defaults(model_cls), "", groups)
    doc = (model_cls.__doc__ or model_cls.__name__).strip().splitlines()[0]
    parts = [
        doc,
        "",
        "Usage: [@ FILE.toml ...] [--section.key VALUE ...]   (precedence: defaults < files < "
        f"{ENV_PREFIX}SECTION__KEY env < flags)",
    ]
    for section, lines in groups.items():
        parts += ["", f"[{section}]", *lines]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------
# TOML writer (stdlib has a reader only)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value), ensure_ascii=False)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + items + "}"
    if value is None:
        return "None"  # only shown in help; dump_toml omits None keys
    raise ConfigError(f"cannot write {type(value).__name__} value {value!r} as TOML")


def _write_section(model: BaseModel, name: str, out: list[str]) -> None:
    """Scalars of one section, then its sub-sections as `[name.sub]` tables."""
    fields = [(k, getattr(model, k)) for k in type(model).model_fields]
    scalars = [(k, v) for k, v in fields if not isinstance(v, BaseModel) and v is not None]
    if name and scalars:
        out.append(f"\n[{name}]")
    out.extend(f"{_toml_key(k)} = {_toml_value(to_jsonable_python(v))}" for k, v in scalars)
    for key, sub in fields:
        if isinstance(sub, BaseModel):
            _write_section(sub, f"{name}.{_toml_key(key)}" if name else _toml_key(key), out)


def dump_toml(cfg: BaseModel) -> str:
    """The resolved config as TOML; `load_config(type(cfg), ['@', file])` reads it back equal.

    None values are omitted (TOML has no null), so they round-trip only when None is the default.
    """
    out: list[str] = []
    _write_section(cfg, "", out)
    return "\n".join(out).lstrip("\n") + "\n"


__all__ = ["ENV_PREFIX", "ConfigError", "dump_toml", "format_help", "load_config", "wants_help"]

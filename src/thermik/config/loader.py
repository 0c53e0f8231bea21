"""Resolve a typed config from TOML files, environment variables and CLI flags.

Precedence, lowest first: model defaults < TOML files (left to right, tables deep-merged)
< `THERMIK_SECTION__KEY` environment variables < `--section.key value` flags.

Every key is checked against the model before pydantic runs, so a typo fails at once with
the full dotted key and the closest valid names (docs/architecture.md, invariant 4). This module imports
only the standard library and pydantic: it must stay fast and never pull in torch.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from thermik.config.surface import default_of, section_model, toml_key, toml_value, variants
from thermik.config.upgrade import pointer
from thermik.errors import ThermikError

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "THERMIK_"
# THERMIK_* switches read at run time, not config keys: the CPU kernels (cpu/kernels.py), the simulated CPU
# (cpu/isa.py), "auto" pinned to float32 (cpu/engine_precision.py) and tracebacks for user errors (cli.py, `--debug`).
RUNTIME_VARIABLES = frozenset({"THERMIK_CPU_KERNELS", "THERMIK_CPU_ISA", "THERMIK_AUTO_PRECISION", "THERMIK_DEBUG"})


class ConfigError(ThermikError, ValueError):
    """A config key or value is wrong; the message names the dotted key and the fix."""

    exit_code = 2


# ---------------------------------------------------------------------------------------
# Model introspection


def _children(field: FieldInfo) -> dict[str, FieldInfo] | None:
    """The keys under a section field: its model's fields, or every variant's of a discriminated union (the chosen
    variant's own check is pydantic's); None for a leaf."""
    sub = section_model(field.annotation)
    if sub is not None:
        return dict(sub.model_fields)
    union = variants(field)
    if union is None:
        return None
    return {name: f for model in union[1].values() for name, f in model.model_fields.items()}


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


def _moved(full: str, source: str) -> ConfigError | None:
    """The one-line pointer for a key of an older layout (config/upgrade.py), or None."""
    where = pointer(full)
    if where is None:
        return None
    return ConfigError(
        f"config key '{full}' (from {source}) has moved: {where}; `thermik config upgrade FILE.toml` rewrites a file"
    )


def _unknown_key(fields: Mapping[str, FieldInfo], prefix: str, key: str, source: str) -> ConfigError:
    full = f"{prefix}{key}"
    moved = _moved(full, source)
    if moved is not None:
        return moved
    names = list(fields)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    where = f"section '{prefix[:-1]}'" if prefix else "the top level"
    hint = f" Did you mean {', '.join(repr(prefix + c) for c in close)}?" if close else ""
    return ConfigError(
        f"unknown config key '{full}' (from {source}).{hint} Valid keys in {where}: {', '.join(names)}. "
        f"`--help{' ' + prefix[:-1] if prefix else ''}` lists them with their defaults."
    )


def _resolve_path(model_cls: type[BaseModel], path: list[str], source: str) -> Any:
    """Check a dotted path against the model; return the annotation of its leaf field."""
    current: Mapping[str, FieldInfo] | None = model_cls.model_fields
    prefix = ""
    annotation: Any = None
    for i, key in enumerate(path):
        if current is None:
            raise ConfigError(
                f"'{prefix[:-1]}' is a value, not a section: '{'.'.join(path)}' is not a config key (from {source})."
            )
        field = current.get(key)
        if field is None:
            raise _unknown_key(current, prefix, key, source)
        annotation = field.annotation
        current = _children(field)
        prefix += key + "."
        if i == len(path) - 1 and current is not None:
            raise _moved(".".join(path), source) or ConfigError(
                f"'{'.'.join(path)}' is a section, not a value (from {source}); set its keys, "
                f"e.g. --{'.'.join(path)}.{next(iter(current))} VALUE."
            )
    return annotation


def _check_table(fields: Mapping[str, FieldInfo], table: Mapping[str, Any], prefix: str, source: str) -> None:
    """Check every key of a (TOML) table against the model's fields, recursing into sections."""
    for key, value in table.items():
        field = fields.get(key)
        if field is None:
            raise _unknown_key(fields, prefix, key, source)
        sub = _children(field)
        if sub is not None and isinstance(value, Mapping):
            _check_table(sub, value, f"{prefix}{key}.", source)
        elif sub is not None:
            moved = _moved(f"{prefix}{key}", source)
            if moved is not None:
                raise moved


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


def read_toml(path_str: str, given: str = "after '@'") -> dict[str, Any]:
    """A TOML file's table; a missing file or a syntax error is a `ConfigError` naming it (and where it was given)."""
    path = Path(path_str)
    if not path.is_file():
        raise ConfigError(f"config file not found: '{path_str}' (given {given}). Check the path.")
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


def _fill_variants(model_cls: type[BaseModel], tree: dict[str, Any], sources: Mapping[str, str], prefix: str) -> None:
    """Give each variant section of `tree` its tag (the default variant's where no source names one) and refuse a key
    of another variant, naming the variant that has it: pydantic would say only 'Extra inputs are not permitted'."""
    default = default_of(model_cls)
    for key, value in tree.items():
        field = model_cls.model_fields.get(key)
        if field is None or not isinstance(value, dict):
            continue
        sub, union = section_model(field.annotation), variants(field)
        if sub is not None:
            _fill_variants(sub, value, sources, f"{prefix}{key}.")
        if union is None:
            continue
        tag, models = union
        chosen = value.setdefault(tag, getattr(getattr(default, key, None), tag, next(iter(models))))
        model = models.get(str(chosen))
        if model is None:
            continue  # pydantic names the valid tags
        for name in value:
            if name not in model.model_fields:
                owner = next(t for t, m in models.items() if name in m.model_fields)
                path = f"{prefix}{key}"
                raise ConfigError(
                    f"'{path}.{name}' is a key of {path}.{tag} = {owner!r}, not of {path}.{tag} = {chosen!r} (from "
                    f"{sources.get(f'{path}.{name}', 'a source')}): set {path}.{tag} = {owner!r} or drop the key; "
                    f"the keys of {chosen!r}: {', '.join(k for k in model.model_fields if k != tag)}."
                )
        _fill_variants(model, value, sources, f"{prefix}{key}.")


def _dotted(model_cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """An error location as the user's dotted key: pydantic puts a variant's tag between its section and its keys."""
    parts: list[str] = []
    fields: Mapping[str, FieldInfo] | None = model_cls.model_fields
    skip_tag = False
    for part in loc:
        if skip_tag and isinstance(part, str):
            skip_tag = False
            continue
        parts.append(str(part))
        field = fields.get(str(part)) if fields else None
        fields = _children(field) if field is not None else None
        skip_tag = field is not None and variants(field) is not None
    return ".".join(parts)


def _validation_error(e: ValidationError, sources: Mapping[str, str], model_cls: type[BaseModel]) -> ConfigError:
    lines = []
    for err in e.errors():
        key, got = _dotted(model_cls, err["loc"]), err["input"]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":  # name the variant key as the user set it, and its choices
            tag = str(err["ctx"]["discriminator"]).strip(chr(39))
            key, got = f"{key}.{'type' if tag.endswith('()') else tag}", err["ctx"]["tag"]
            msg = msg.replace(f" found using {tag}", "")  # a callable discriminator (config/variants.py)
        if key:
            leaf = key
            while leaf and leaf not in sources and "." in leaf:
                leaf = leaf.rsplit(".", 1)[0]
            src = f", from {sources[leaf]}" if leaf in sources else ""
            lines.append(f"{key}: {msg} (got {got!r}{src})")
        else:
            lines.append(msg)
    return ConfigError("invalid config:\n  " + "\n  ".join(lines))


def _own_keys(
    model_cls: type[BaseModel], shared_with: type[BaseModel] | None, table: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """The top-level keys of `table` that `model_cls` has, after checking the others against `shared_with` (a
    config one file serves together with `model_cls`: `thermik inference @ rl.toml` reads the server's part)."""
    own = {k: v for k, v in table.items() if k in model_cls.model_fields or shared_with is None}
    _check_table(model_cls.model_fields, own, "", source)
    if shared_with is not None:
        _check_table(shared_with.model_fields, {k: v for k, v in table.items() if k not in own}, "", source)
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
        table = _own_keys(model_cls, shared_with, read_toml(path), f"file '{path}'")
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
    _fill_variants(model_cls, tree, sources, "")
    try:
        return model_cls.model_validate(tree)
    except ValidationError as e:
        raise _validation_error(e, sources, model_cls) from None


# ---------------------------------------------------------------------------------------
# TOML writer (stdlib has a reader only)


def _toml_value(value: Any) -> str:
    try:
        return toml_value(value)
    except TypeError as e:
        raise ConfigError(str(e)) from None


def _write_section(model: BaseModel, name: str, out: list[str]) -> None:
    """Scalars of one section, then its sub-sections as `[name.sub]` tables."""
    fields = [(k, getattr(model, k)) for k in type(model).model_fields]
    scalars = [(k, v) for k, v in fields if not isinstance(v, BaseModel) and v is not None]
    if name and scalars:
        out.append(f"\n[{name}]")
    out.extend(f"{toml_key(k)} = {_toml_value(to_jsonable_python(v))}" for k, v in scalars)
    for key, sub in fields:
        if isinstance(sub, BaseModel):
            _write_section(sub, f"{name}.{toml_key(key)}" if name else toml_key(key), out)


def dump_table(table: Mapping[str, Any]) -> str:
    """A nested table (what a TOML file holds) as TOML: each table's values, then its sub-tables as `[a.b]`."""
    out: list[str] = []

    def write(node: Mapping[str, Any], name: str) -> None:
        scalars = [(k, v) for k, v in node.items() if not isinstance(v, Mapping)]
        if name and scalars:
            out.append(f"\n[{name}]")
        out.extend(f"{toml_key(k)} = {_toml_value(v)}" for k, v in scalars)
        for key, sub in node.items():
            if isinstance(sub, Mapping):
                write(sub, f"{name}.{toml_key(key)}" if name else toml_key(key))

    write(table, "")
    return "\n".join(out).lstrip("\n") + "\n"


def dump_toml(cfg: BaseModel) -> str:
    """The resolved config as TOML; `load_config(type(cfg), ['@', file])` reads it back equal.

    None values are omitted (TOML has no null), so they round-trip only when None is the default.
    """
    out: list[str] = []
    _write_section(cfg, "", out)
    return "\n".join(out).lstrip("\n") + "\n"


__all__ = ["ENV_PREFIX", "ConfigError", "dump_table", "dump_toml", "load_config", "read_toml"]

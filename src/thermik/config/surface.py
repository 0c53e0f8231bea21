"""The key surface of a config model: every settable key with its type, default and description.

One walk serves three readers: `--help` (help.py), the frozen-surface files (`scripts/config_surface.py`, tested by
tests/test_config_surface.py) and the loader's key checks (loader.py). A section whose field is a discriminated union
(`Annotated[A | B, Field(discriminator="type")]`) has variants: its keys are listed per variant as
`algorithm.loss[type=gspo].clip_low`, or, where a variant is chosen, only the chosen one's as `algorithm.loss.clip_low`.
Imports only the standard library and pydantic (no torch).
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from thermik.config.variants import variant_models

REQUIRED = object()  # the default of a field that has none


@dataclass(frozen=True)
class Knob:
    """One settable key: `key` dotted (with `[tag=value]` after a union section listed per variant)."""

    key: str
    annotation: Any
    default: Any
    description: str

    @property
    def type_name(self) -> str:
        return type_name(self.annotation)

    @property
    def shown_default(self) -> str:
        return "required" if self.default is REQUIRED else toml_value(to_jsonable_python(self.default))


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel a field nests (also through `X | None`), or None for a leaf or a union of several models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for m in (section_model(a) for a in get_args(annotation)) if m is not None]
        if len(models) == 1:
            return models[0]
    return None


def variants(field: FieldInfo) -> tuple[str, dict[str, type[BaseModel]]] | None:
    """(tag name, {tag value: model}) of a discriminated-union field, else None."""
    tagged = variant_models(field.annotation)  # config/variants.py: members tagged, `type` defaulted
    if tagged:
        return "type", tagged
    tag = field.discriminator
    if not isinstance(tag, str) or get_origin(field.annotation) not in (Union, types.UnionType):
        return None
    out: dict[str, type[BaseModel]] = {}
    for model in get_args(field.annotation):
        if isinstance(model, type) and issubclass(model, BaseModel) and tag in model.model_fields:
            for value in get_args(model.model_fields[tag].annotation) or (model.model_fields[tag].default,):
                out[str(value)] = model
    return tag, out


def default_of(model_cls: type[BaseModel]) -> BaseModel | None:
    """`model_cls()` where every field has a default, else None."""
    try:
        return model_cls()
    except ValidationError:
        return None


# chosen(dotted path of a union section) -> its chosen tag value, or None to list every variant
Chooser = Callable[[str], str | None]


def knobs(
    model_cls: type[BaseModel],
    default: BaseModel | None = None,
    prefix: str = "",
    chosen: Chooser | None = None,
    skip: str = "",
) -> Iterator[Knob]:
    """Every leaf key of `model_cls`, depth first in field order; `default`: the instance whose values are shown
    (its class's defaults when None); `skip`: a field not listed (a variant's tag, listed once for the union)."""
    default = default if default is not None else default_of(model_cls)
    for name, field in model_cls.model_fields.items():
        if name == skip:
            continue
        key = f"{prefix}{name}"
        value = getattr(default, name) if default is not None else _field_default(field)
        sub = section_model(field.annotation)
        if sub is not None:
            yield from knobs(sub, value if isinstance(value, BaseModel) else None, f"{key}.", chosen)
            continue
        union = variants(field)
        if union is None:
            yield Knob(key, field.annotation, value, field.description or "")
            continue
        yield from _variant_knobs(key, field, union, value, chosen)


def _variant_knobs(
    key: str, field: FieldInfo, union: tuple[str, dict[str, type[BaseModel]]], value: Any, chosen: Chooser | None
) -> Iterator[Knob]:
    """The tag (`key.type`, its choices as the type), then the knobs of every variant (`key[type=v].knob`), or of
    the chosen one only (`key.knob`: help), the default variant where `chosen` names none."""
    tag, models = union
    default_tag = str(getattr(value, tag)) if isinstance(value, BaseModel) else REQUIRED
    yield Knob(f"{key}.{tag}", Literal[tuple(models)], default_tag, field.description or "")
    pick = None
    if chosen is not None:
        pick = chosen(key) or (default_tag if isinstance(default_tag, str) else next(iter(models)))
    for tag_value, model in models.items():
        if pick is not None and tag_value != pick:
            continue
        inst = value if isinstance(value, model) and str(getattr(value, tag)) == tag_value else None
        inner = f"{key}." if pick is not None else f"{key}[{tag}={tag_value}]."
        yield from knobs(model, inst or _variant_default(model, tag, tag_value), inner, chosen, skip=tag)


def _variant_default(model: type[BaseModel], tag: str, value: str) -> BaseModel | None:
    try:
        return model.model_validate({tag: value})
    except ValidationError:
        return None


def _field_default(field: FieldInfo) -> Any:
    return REQUIRED if field.is_required() else field.get_default(call_default_factory=True)


def surface(model_cls: type[BaseModel]) -> list[str]:
    """`dotted.key type default` for every key of `model_cls`, each union section's variants listed one by one."""
    return [f"{k.key} {k.type_name} {k.shown_default}" for k in knobs(model_cls)]


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in get_args(annotation)) + "}"
    if origin is not None:
        args = get_args(annotation)
        if origin in (Union, types.UnionType):
            return " | ".join(type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def toml_key(key: str) -> str:
    return (
        key
        if key.replace("_", "").replace("-", "").isalnum() and key.isascii()
        else json.dumps(key, ensure_ascii=False)
    )


def toml_value(value: Any) -> str:
    """`value` as a TOML literal (None as `None`: only shown in help and surface files, never written)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value), ensure_ascii=False)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    if value is None:
        return "None"
    raise TypeError(f"cannot write {type(value).__name__} value {value!r} as TOML")

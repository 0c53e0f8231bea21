"""Config sections with variants: a `type` key picks one, and each variant carries only its own knobs.

A pydantic discriminated union on `type` (`Field(discriminator=...)`); a table that leaves `type` out is the
section's default variant, so `[algorithm.loss] clip_low = 0.1` tunes the default loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag


def variant_name(model: type[BaseModel]) -> str:
    """The `type` value that picks `model`."""
    return str(model.model_fields["type"].default)


def variants(default: type[BaseModel], *others: type[BaseModel]) -> Any:
    """The union of `default` and `others`, picked by `type`; without a `type` key the value is `default`."""
    fallback = variant_name(default)

    def tag(value: Any) -> str | None:
        if isinstance(value, Mapping):
            return str(value.get("type", fallback))
        return getattr(value, "type", None)

    members = tuple(Annotated[m, Tag(variant_name(m))] for m in (default, *others))
    return Annotated[Union[members], Discriminator(tag)]  # noqa: UP007 (a runtime tuple of members)


def variant_models(annotation: Any) -> dict[str, type[BaseModel]]:
    """{type value: model} of a variant section's annotation; {} for anything else."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    out: dict[str, type[BaseModel]] = {}
    for member in get_args(annotation) if get_origin(annotation) is Union else ():
        if get_origin(member) is Annotated:
            model, *meta = get_args(member)
            tags = [m.tag for m in meta if isinstance(m, Tag)]
            if tags and isinstance(model, type) and issubclass(model, BaseModel):
                out[tags[0]] = model
    return out

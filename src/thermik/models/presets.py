"""Tiny causal LMs built from a named preset and saved as an ordinary local HF model directory (no hub)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from thermik.errors import ThermikError
from thermik.models.tokenizer import build_tokenizer

Architecture = Literal["qwen2", "qwen3", "llama"]

CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}

INITIALIZER_RANGE = 0.1
"""With transformers' default 0.02, ~1M models stayed on a plateau and never learned to copy (docs/models.md)."""

MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class Preset:
    arch: Architecture
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    initializer_range: float = INITIALIZER_RANGE
    template: str = "chatml-tools"  # a name in models.chat.CHAT_TEMPLATES

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


_SIZE_1M = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384}
_SIZE_5M = {"hidden_size": 256, "num_layers": 6, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 768}
_SIZE_20M = {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1792}
# Wide and shallow: two layers are what copying a span needs (a previous-token head, then an induction head); 8 full
# heads of 32 on a 256-wide stream cost about as much per training step as the 1M shape (docs/models.md, "Presets").
# Weights at 1.13/sqrt(hidden), as 0.1 is at 128 wide.
_SIZE_WIDE = {"hidden_size": 256, "num_layers": 2, "num_heads": 8, "num_kv_heads": 8, "intermediate_size": 512}

PRESETS: dict[str, Preset] = {
    "qwen2-1m": Preset("qwen2", **_SIZE_1M),
    "qwen2-5m": Preset("qwen2", **_SIZE_5M),
    "qwen2-20m": Preset("qwen2", **_SIZE_20M),
    "qwen2-1.4m": Preset("qwen2", **_SIZE_WIDE, initializer_range=0.07),
    "qwen3-1m": Preset("qwen3", **_SIZE_1M),
    "qwen3-5m": Preset("qwen3", **_SIZE_5M),
    # Qwen3's thinking rules in the chat template: earlier turns' <think> is stripped from history (docs/models.md).
    "qwen3-think-1m": Preset("qwen3", **_SIZE_1M, template="qwen3-thinking"),
    "qwen3-think-5m": Preset("qwen3", **_SIZE_5M, template="qwen3-thinking"),
    "llama-1m": Preset("llama", **_SIZE_1M),
    "llama-5m": Preset("llama", **_SIZE_5M),
    "llama-20m": Preset("llama", **_SIZE_20M),
}


# Published models' shapes (Preset + vocabulary size), built with random weights where their weights cannot be had:
# speed figures only (benchmarks/trainer_mfu.py, benchmarks/engine_vs_hf.py `--shape`, docs/gpu.md).
SHAPES: dict[str, tuple[Preset, int]] = {
    "smollm2-135m": (Preset("llama", hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                            intermediate_size=1536), 49152),
    "qwen2.5-0.5b": (Preset("qwen2", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                            intermediate_size=4864), 151936),
}  # fmt: skip


class ModelOutError(ThermikError, FileExistsError):
    """`thermik model init --out` names a path that holds something else."""


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def build_config(
    name: str, tokenizer: PreTrainedTokenizerBase | None = None, context: int = MAX_POSITION_EMBEDDINGS
) -> PretrainedConfig:
    """The HF config of preset `name`, with vocabulary and special ids taken from `tokenizer` (default: ours), and a
    context window of `context` positions."""
    tok = tokenizer if tokenizer is not None else build_tokenizer()
    special = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}
    return _config(get_preset(name), len(tok), special, context)


def shape_config(name: str) -> PretrainedConfig:
    """The HF config of the published shape `name` (SHAPES), for a random-init model of that size."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; valid shapes: {', '.join(SHAPES)}")
    preset, vocab_size = SHAPES[name]
    return _config(preset, vocab_size, {"eos_token_id": 0, "pad_token_id": 0, "bos_token_id": 0})


def _config(
    preset: Preset, vocab_size: int, special: dict[str, int | None], context: int = MAX_POSITION_EMBEDDINGS
) -> PretrainedConfig:
    return CONFIG_CLASSES[preset.arch](
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=context,
        initializer_range=preset.initializer_range,
        tie_word_embeddings=True,
        dtype="float32",
        **special,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once); works on meta-device models too."""
    return sum(p.numel() for p in model.parameters())


def count_preset_parameters(name: str) -> int:
    """Parameter count of a preset without allocating its weights (built on the meta device)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_config(name))
    return count_parameters(model)


def init_model(
    preset: str, out_dir: str | Path, seed: int = 0, overwrite: bool = False, context: int = MAX_POSITION_EMBEDDINGS
) -> Path:
    """Build preset `preset` with weights seeded by `seed` and a context window of `context` tokens (rotary
    positions: any length trains); save model, tokenizer and chat template to `out_dir`.

    The directory appears complete or not at all: everything is written to a temp dir beside it, then renamed.
    An existing non-empty `out_dir` is refused unless `overwrite=True`.
    """
    out = Path(out_dir)
    get_preset(preset)  # fail on a bad name before touching the disk
    if out.exists() and not out.is_dir():
        raise ModelOutError(f"model output path {out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ModelOutError(f"model output dir {out} is not empty; pass --overwrite to replace it (overwrite=True)")

    if context < 64:
        raise ThermikError(f"--context {context} is too short for a chat; use at least 64 tokens")
    tokenizer = build_tokenizer(get_preset(preset).template, context)
    config = build_config(preset, tokenizer, context)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` onto `dst`; an existing `dst` is moved aside first and deleted only after the rename."""
    if not dst.exists():
        os.replace(src, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.replace(dst, old / dst.name)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)

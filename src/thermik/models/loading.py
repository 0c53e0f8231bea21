"""Load any local HF causal LM and its tokenizer. Never contacts a hub: every call passes local_files_only."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from thermik.errors import ThermikError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


MAKE_A_MODEL = (
    "build one with `thermik model init --preset qwen2-1m --out DIR` or import one with `thermik model import SRC "
    "--out DIR`, then pass --model.path DIR"
)


class ModelPathError(ThermikError, FileNotFoundError):
    """A model path that is not a local Hugging Face model directory; the message names the commands that make one."""


def _model_dir(path: str | Path, what: str, required_file: str) -> Path:
    p = Path(path)
    if not str(path).strip():
        raise ModelPathError(f"the {what} path is empty", hint=MAKE_A_MODEL)
    if not p.is_dir():
        raise ModelPathError(f"{what} directory {p} does not exist", hint=MAKE_A_MODEL)
    if not (p / required_file).is_file():
        raise ModelPathError(f"{what} directory {p} has no {required_file}: not a Hugging Face model directory",
                             hint=MAKE_A_MODEL)  # fmt: skip
    return p


def load_tokenizer(path: str | Path, chat_template: str | Path = "") -> PreTrainedTokenizerBase:
    """The tokenizer saved in local dir `path` with its chat template, or the template in file `chat_template`."""
    p = _model_dir(path, "model", "tokenizer_config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError) as e:
        raise OSError(f"could not load the tokenizer from {p}: {e}") from e
    if chat_template:
        template = Path(chat_template)
        if not template.is_file():
            raise ModelPathError(f"--model.chat_template: {template} is not a file (a jinja chat template)")
        tokenizer.chat_template = template.read_text()
    return tokenizer


def load_model(path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu") -> PreTrainedModel:
    """The causal LM saved in local dir `path`, in eval mode, with parameters of `dtype` on `device`."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    p = _model_dir(path, "model", "config.json")
    try:
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        raise OSError(f"could not load the model from {p}: {e}") from e
    return model.to(device)

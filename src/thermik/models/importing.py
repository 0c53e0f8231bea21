"""Turn a GGUF file, or a local HF model directory, into a clean local HF directory (no hub).

The result holds safetensors weights, config.json, generation_config.json, the tokenizer files and the chat
template (``chat_template.jinja``): everything `thermik.models.loading` reads. A GGUF's weights are dequantized to a
dense dtype (float32 by default; Q4/Q8 blocks become plain tensors), and its tokenizer and chat template come from
the GGUF's own metadata. The directory is written to a temporary sibling and renamed, so it is complete or absent.

Reading GGUF needs the optional packages ``gguf`` and ``accelerate`` (``pip install 'thermik[real]'``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from thermik.atomic import publish_dir
from thermik.errors import ThermikError
from thermik.models.loading import DTYPES

GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "install the optional extra: pip install 'thermik[real]' (gguf, accelerate)"
PROVENANCE_FILE = "thermik_import.json"


class ImportModelError(ThermikError, ValueError):
    """The source cannot be imported; the message names what is wrong and what to do."""


@dataclass(frozen=True)
class ImportResult:
    out: Path
    source: Path
    kind: str  # "gguf" | "hf"
    architecture: str
    num_parameters: int


def _require_gguf_support() -> None:
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError as e:
            raise ImportModelError(f"reading GGUF files needs the package {module!r}; {INSTALL_HINT}") from e


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file, read from its header (no tensor data)."""
    _require_gguf_support()
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).get_field("general.architecture")
    except (ValueError, OSError) as e:
        raise ImportModelError(f"{path} starts like a GGUF but its header is unreadable ({e}); re-download it") from e
    if field is None:
        raise ImportModelError(f"{path} has no general.architecture key; it is not a model GGUF file")
    return bytes(field.parts[field.data[0]]).decode()


def supported_gguf_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def _check_gguf(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ImportModelError(
            f"{path} is not a GGUF file (it starts with {head!r}, a GGUF starts with {GGUF_MAGIC!r}); "
            "pass a .gguf file or a local Hugging Face model directory (with config.json)"
        )
    arch = gguf_architecture(path)
    supported = supported_gguf_architectures()
    if arch.replace("-", "_") not in supported and arch.replace("moe", "_moe") not in supported:
        raise ImportModelError(
            f"{path} holds a {arch!r} model, which transformers cannot load from GGUF; supported architectures: "
            f"{', '.join(supported)}. Convert it to a Hugging Face directory elsewhere and import that directory"
        )
    return arch


def _resolve_source(src: Path) -> tuple[str, Path]:
    """("gguf", file) or ("hf", directory); a directory without config.json but with one .gguf means that file."""
    if not src.exists():
        raise ImportModelError(f"{src} does not exist; pass a .gguf file or a local Hugging Face model directory")
    if src.is_file():
        return "gguf", src
    if (src / "config.json").is_file():
        return "hf", src
    ggufs = sorted(src.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs[0]
    found = f"{len(ggufs)} .gguf files ({', '.join(p.name for p in ggufs)})" if ggufs else "no .gguf file"
    raise ImportModelError(
        f"{src} has no config.json and {found}; pass the .gguf file itself or a Hugging Face model directory"
    )


def _clear_quantization_markers(model: PreTrainedModel) -> None:
    """`save_pretrained` refuses a model "quantized with gguf"; the weights are dense now, so drop the markers."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)  # deletes hf_quantizer, config.quantization_config, ...
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise ImportModelError(f"the model still holds packed GGUF modules ({', '.join(packed)}) after dequantizing")


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import GgufConfig

    d, name = str(path.parent), path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(
            d, gguf_file=name, dtype=dtype, local_files_only=True, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=name, local_files_only=True)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        raise ImportModelError(f"transformers could not load {path}: {e}") from e
    _clear_quantization_markers(model)
    return model, tokenizer


def _load_hf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ImportModelError(f"transformers could not load the model directory {path}: {e}") from e
    return model, tokenizer


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path, provenance: dict[str, Any]) -> None:
    if tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)  # safetensors
    tokenizer.save_pretrained(out)
    (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")


def _file_modes(d: Path) -> None:
    """safetensors writes 0600 files: give them the usual modes, so other users can read a shared model dir."""
    umask = os.umask(0)
    os.umask(umask)
    for f in d.iterdir():
        f.chmod(0o666 & ~umask)


def import_model(
    src: str | Path,
    out: str | Path,
    dtype: str = "float32",
    chat_template: str | Path | None = None,
    overwrite: bool = False,
) -> ImportResult:
    """Write the model at `src` (a GGUF file or a local HF dir) to `out` as a clean HF directory.

    `chat_template` (a jinja file) replaces the source's template; a source without one needs it.
    """
    if dtype not in DTYPES:
        raise ImportModelError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    src_path, out_path = Path(src).expanduser(), Path(out).expanduser()
    if out_path.exists() and not overwrite:
        raise ImportModelError(f"{out_path} already exists; pass --overwrite to replace it")
    kind, path = _resolve_source(src_path)
    if kind == "gguf":
        arch = _check_gguf(path)
        model, tokenizer = _load_gguf(path, DTYPES[dtype])
    else:
        model, tokenizer = _load_hf(path, DTYPES[dtype])
        arch = str(model.config.model_type)
    if chat_template is not None:
        tokenizer.chat_template = Path(chat_template).read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise ImportModelError(f"{path} has no chat template; pass one with --chat-template FILE.jinja")
    provenance = {"source": str(path.resolve()), "kind": kind, "architecture": arch, "dtype": dtype}

    def write(tmp: Path) -> None:
        _save(model, tokenizer, tmp, provenance)
        _file_modes(tmp)

    publish_dir(out_path, write)
    return ImportResult(out_path, path, kind, arch, sum(p.numel() for p in model.parameters()))

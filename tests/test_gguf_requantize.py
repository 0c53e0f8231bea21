"""scripts/gguf_requantize.py: a GGUF re-quantized to Q8_0 keeps its metadata and tokenizer and imports back to the
same model within Q8_0's rounding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
from gguf_support import write_gguf

from thermik.models.importing import import_model
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import init_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gguf_requantize.py"


def test_q8_0_copy_imports_to_the_same_model(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gguf_requantize", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = init_model("llama-1m", tmp_path / "src", seed=3)
    model, tok = load_model(source), load_tokenizer(source)
    f32 = write_gguf(model, tok, tmp_path / "m.f32.gguf")
    count = tool.requantize(f32, tmp_path / "m.q8_0.gguf", "Q8_0")
    assert count > 0 and (tmp_path / "m.q8_0.gguf").stat().st_size < f32.stat().st_size / 3
    out = import_model(tmp_path / "m.q8_0.gguf", tmp_path / "out").out
    again, tok_again = load_model(out), load_tokenizer(out)
    assert tok_again.get_vocab() == tok.get_vocab()
    ids = torch.tensor([tok.encode("12 * 7 = 84, and 3 + 4 = 7")])
    with torch.no_grad():
        ref, got = model(ids).logits, again(ids).logits
    # Q8_0: 8 bits per weight, one scale per 32 (relative step 1/127): logits move by a few percent of their size
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert not torch.equal(got, ref)

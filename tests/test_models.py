"""Tiny local models: chat template, character-level tokenizer, presets, save/reload."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from thermik.errors import ThermikError
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import PRESETS, build_config, count_parameters, count_preset_parameters, init_model
from thermik.models.tokenizer import SPECIAL_TOKENS, TAG_TOKENS, VOCAB_SIZE, build_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "Answer inside <answer></answer>."},
    {"role": "user", "content": "What is 12+3*4?"},
    {
        "role": "assistant",
        "content": "<think>use the tool</think>",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "12+3*4"}}},
            {"type": "function", "function": {"name": "calculate", "arguments": '{"expression": "3*4"}'}},
        ],
    },
    {"role": "tool", "content": "24"},
    {"role": "tool", "content": "12"},
    {"role": "assistant", "content": "<answer>24</answer>"},
    {"role": "user", "content": "And 1+1?"},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "calculate", "arguments": {}}}]},
    {"role": "tool", "content": "2"},
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def render(tok, messages, tools=None, add_generation_prompt=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)


# ---- chat template -------------------------------------------------------------------------------------------


def test_template_renders_tools_calls_and_grouped_responses(tok):
    text = render(tok, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nAnswer inside <answer></answer>.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]["function"]) + "\n</tools>" in text
    # dict arguments go through tojson; string arguments are rendered as-is, not double-encoded
    assert (
        "<|im_start|>assistant\n<think>use the tool</think>\n<tool_call>\n"
        '{"name": "calculate", "arguments": {"expression": "12+3*4"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "calculate", "arguments": {"expression": "3*4"}}\n</tool_call><|im_end|>\n'
    ) in text
    # consecutive tool results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>24</tool_response>\n<tool_response>12</tool_response><|im_end|>\n"
    ) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "calculate", "arguments": {}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<tool_response>2</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == text.count("<|im_end|>") + 1


def test_template_creates_system_turn_for_tools_only_when_needed(tok):
    user = [{"role": "user", "content": "hi"}]
    with_tools = render(tok, user, tools=TOOLS)
    assert with_tools.startswith("<|im_start|>system\n# Tools\n<tools>\n{")
    assert with_tools.endswith("</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert render(tok, user) == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_is_prefix_consistent(tok, tools):
    full = render(tok, CONVERSATION, tools=tools)
    for k in range(1, len(CONVERSATION)):
        continues_tool_run = CONVERSATION[k]["role"] == "tool" and CONVERSATION[k - 1]["role"] == "tool"
        prefix = render(tok, CONVERSATION[:k], tools=tools)
        if continues_tool_run:
            # documented exception: the shared user turn is closed after the last tool result
            assert not full.startswith(prefix)
            continue
        assert full.startswith(prefix), k
        if CONVERSATION[k]["role"] == "assistant":
            assert full.startswith(render(tok, CONVERSATION[:k], tools=tools, add_generation_prompt=True)), k


def test_template_token_ids_are_prefix_consistent(tok):
    full = tok.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"]
    prefix = tok.apply_chat_template(CONVERSATION[:3], tools=TOOLS)["input_ids"]
    assert full[: len(prefix)] == prefix


def test_assistant_mask_covers_sampled_text_and_eos_only(tok):
    messages = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<answer>2</answer>"}]
    out = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(masked) == "<answer>2</answer><|im_end|>"


def test_template_rejects_unknown_role(tok):
    with pytest.raises(Exception, match="unknown message role"):
        render(tok, [{"role": "robot", "content": "x"}])


# ---- tokenizer -----------------------------------------------------------------------------------------------


def test_tokenizer_basics(tok):
    assert len(tok) == VOCAB_SIZE == 269
    assert tok.padding_side == "left"
    assert tok.bos_token is None
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id
    ids = tok.encode("12+3")
    assert len(ids) == 4
    assert [tok.decode([i]) for i in ids] == ["1", "2", "+", "3"]
    assert tok.encode("é") != tok.encode("e") and len(tok.encode("é")) == 2  # one token per UTF-8 byte


@pytest.mark.parametrize("tag", SPECIAL_TOKENS + TAG_TOKENS)
def test_each_tag_is_one_token(tok, tag):
    ids = tok.encode(f"a{tag}b")
    assert len(ids) == 3
    assert tok.convert_ids_to_tokens(ids[1]) == tag
    assert tok.decode(ids, skip_special_tokens=False) == f"a{tag}b"


def test_skip_special_tokens_keeps_task_tags(tok):
    ids = tok.encode("<think>x</think><answer>7</answer><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "x<answer>7</answer>"


_TAGGED_TEXT = st.lists(
    st.one_of(st.text(max_size=20), st.sampled_from(SPECIAL_TOKENS + TAG_TOKENS), st.from_regex(r"[0-9+*\- ]{1,8}")),
    max_size=8,
).map("".join)


@settings(max_examples=100, deadline=None)
@given(_TAGGED_TEXT)
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert len(ids) <= len(text.encode("utf-8"))


def test_batch_padding_is_left(tok):
    batch = tok(["1+1", "12+34"], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1]


# ---- presets, save and reload --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts(name):
    n = count_preset_parameters(name)
    target = {"1m": 1e6, "1.4m": 1.4e6, "5m": 5e6, "20m": 20e6}[name.rsplit("-", 1)[1]]
    assert 0.7 * target <= n <= 1.3 * target, n


def test_unknown_preset_lists_valid_names(tmp_path):
    with pytest.raises(ValueError, match=r"qwen2-1m.*llama-20m"):
        init_model("gpt5-1m", tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("name", ["qwen2-1m", "qwen3-1m", "llama-1m"])
def test_init_save_reload_round_trip(tmp_path, name):
    out = init_model(name, tmp_path / name, seed=3)
    assert (out / "model.safetensors").is_file() and (out / "chat_template.jinja").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir renamed away

    tok = load_tokenizer(out)
    model = load_model(out)
    assert model.config.vocab_size == len(tok) == VOCAB_SIZE
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert 0.05 < model.get_input_embeddings().weight.std().item() < 0.2  # initializer_range 0.1
    if name.startswith("qwen3"):
        assert model.config.head_dim == 32

    # reloaded tokenizer: left padding and chat template survive
    assert tok.padding_side == "left" and tok.bos_token is None
    reference = build_tokenizer()
    messages = CONVERSATION[:4]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == render(reference, messages, tools=TOOLS, add_generation_prompt=True)
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)["input_ids"]
    assert ids == reference.encode(text)

    # same seed -> same weights; the reloaded model computes the same logits
    torch.manual_seed(0)
    x = torch.tensor([ids[-40:]])
    again = init_model(name, tmp_path / "again", seed=3)
    with torch.no_grad():
        first = model(x).logits
        second = load_model(again)(x).logits
    assert torch.equal(first, second)


def test_reloaded_logits_match_in_memory_model(tmp_path):
    out = init_model("qwen2-1m", tmp_path / "m", seed=1)
    model = load_model(out)
    model_bf16 = load_model(out, dtype="bfloat16")
    assert model_bf16.dtype == torch.bfloat16
    x = torch.tensor([build_tokenizer().encode("12+3=15")])
    with torch.no_grad():
        logits = model(x).logits
    torch.manual_seed(1)
    fresh = AutoModelForCausalLM.from_config(build_config("qwen2-1m")).eval()
    with torch.no_grad():
        assert torch.equal(fresh(x).logits, logits)
    assert count_parameters(fresh) == count_parameters(model) == count_preset_parameters("qwen2-1m")


def test_init_refuses_non_empty_dir_unless_overwrite(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        init_model("llama-1m", out)
    assert (out / "keep.txt").exists()
    init_model("llama-1m", out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_init_into_existing_empty_dir(tmp_path):
    (tmp_path / "m").mkdir()
    assert (init_model("llama-1m", tmp_path / "m") / "config.json").is_file()


def test_loading_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_model(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_tokenizer(missing)
    with pytest.raises(ThermikError, match="`thermik model init --preset qwen2-1m --out DIR` or import one with"):
        load_model(missing)  # a one-line CLI error naming the commands that make a model, not a Python function
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path / "empty")
    with pytest.raises(ValueError, match="float32"):
        load_model(tmp_path / "empty", dtype="fp8")


def test_load_model_sets_eval_mode_and_device(tmp_path):
    model = load_model(init_model("qwen3-1m", tmp_path / "m"), device="cpu")
    assert not model.training
    assert next(model.parameters()).device == torch.device("cpu")


def test_init_context_sets_the_window_thermik_reads_and_the_model_runs_past_2048(tmp_path):
    from thermik.models.context_window import context_window

    out = init_model("qwen2-1m", tmp_path / "m", seed=1, context=4096)
    assert context_window(out, load_tokenizer(out)) == 4096
    assert context_window(init_model("qwen2-1m", tmp_path / "d", seed=1), None) == 2048
    with torch.no_grad():
        logits = load_model(out)(torch.zeros(1, 3000, dtype=torch.long)).logits
    assert logits.shape[1] == 3000 and torch.isfinite(logits).all()
    with pytest.raises(ThermikError, match="--context"):
        init_model("qwen2-1m", tmp_path / "s", context=16)

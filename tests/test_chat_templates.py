"""Real-world chat templates: tools never dropped silently, and multi-turn tool episodes keep the exact prefix.

Templates are fixtures (tests/fixtures/chat_templates/: SmolLM2's own, Qwen2.5- and Llama-3.1-style) on byte-level
fixture tokenizers; SmolLM2's real tokenizer joins in when the imported model is on this machine (tests/real_model.py).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from real_model import smollm2_dir
from test_rollout import play
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from thermik.config import load_config
from thermik.config.schema import RunConfig
from thermik.models.chat import ChatTokenizer, ToolsIgnoredWarning, with_system_text
from thermik.models.loading import load_tokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits
from thermik.tasks.calculator.env import CALCULATE_SCHEMA
from thermik.tasks.registry import generate_rows
from thermik.tools.parsers import TOOL_CALL_FORMATTERS, format_hermes_tool_call, get_parser

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|python_tag|>", "<|finetune_right_pad_id|>")  # fmt: skip
REAL = "smollm2-real"
LIMITS = LoopLimits(max_turns=4, max_input_length=4096, max_generate_length=256, max_sequence_length=8192)
needs_real = pytest.mark.skipif(smollm2_dir() is None, reason="no imported SmolLM2 (thermik model import)")


def _llama3_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, no merges, Llama-3's special tokens; bos <|begin_of_text|>, eos <|eot_id|>."""
    tok = Tokenizer(
        models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, merges=[])
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        clean_up_tokenization_spaces=False,
    )


def make_chat(template: str, tool_format: str = "hermes") -> ChatTokenizer:
    if template == REAL:
        return ChatTokenizer(load_tokenizer(smollm2_dir()), tool_format)
    tok = _llama3_tokenizer() if template == "llama3_1" else build_tokenizer()
    if template != "thermik":
        tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    return ChatTokenizer(tok, tool_format)


@pytest.fixture(scope="module")
def row() -> dict:
    return generate_rows("calculator", 1, seed=3, split="eval")[0]


@pytest.mark.parametrize(
    ("template", "renders"),
    [("thermik", True), ("smollm2", False), ("qwen2_5", True), ("llama3_1", True),
     pytest.param(REAL, False, marks=needs_real)],
)  # fmt: skip
def test_probe_detects_templates_that_ignore_tools(template, renders):
    assert make_chat(template).renders_tools is renders


@pytest.mark.parametrize("template", ["smollm2", pytest.param(REAL, marks=needs_real)])
def test_smollm2_prompt_carries_the_calculator_schema_and_warns_once(template, row):
    chat = make_chat(template)
    with pytest.warns(ToolsIgnoredWarning, match="ignores `tools`.*model.chat_template") as record:
        text = chat.tokenizer.decode(chat.encode_prompt(row["prompt"], [CALCULATE_SCHEMA]))
        chat.encode_prompt(row["prompt"], [CALCULATE_SCHEMA])
    assert sum(issubclass(w.category, ToolsIgnoredWarning) for w in record) == 1
    assert json.dumps(CALCULATE_SCHEMA["function"]) in text
    system = text.split("<|im_end|>")[0]  # the row's own system message, then the tools, in one system turn
    assert system.startswith("<|im_start|>system\n" + row["prompt"][0]["content"] + "\n\n# Tools")
    assert format_hermes_tool_call("function_name", {"argument_name": "value"}) in system
    assert "You are a helpful AI assistant named SmolLM" not in text  # a system message exists, no default one


def test_fallback_without_system_message_adds_one():
    chat = make_chat("smollm2")
    with pytest.warns(ToolsIgnoredWarning):
        text = chat.render([{"role": "user", "content": "What is 2+3?"}], [CALCULATE_SCHEMA])
    assert text.startswith("<|im_start|>system\n# Tools\n") and text.count("<|im_start|>system") == 1


def test_fallback_appends_to_a_system_message_given_as_parts():
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "x"},
    ]
    out = with_system_text(messages, "# Tools")
    assert out[0]["content"] == [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "\n\n# Tools"}]
    assert messages[0]["content"] == [{"type": "text", "text": "Be brief."}] and out[1:] == messages[1:]


@pytest.mark.parametrize("tool_format", sorted(TOOL_CALL_FORMATTERS))
def test_fallback_call_example_is_what_the_configured_parser_reads(tool_format):
    chat = make_chat("smollm2", tool_format)
    with pytest.warns(ToolsIgnoredWarning, match=repr(tool_format)):
        text = chat.render([{"role": "user", "content": "hi"}], [CALCULATE_SCHEMA])
    example = text.split("<|im_end|>")[0].rsplit(":\n", 1)[1]
    parsed = get_parser(tool_format)(example, None)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("function_name", {"argument_name": "value"})]


def test_fallback_call_examples_are_written_by_each_parser_s_formatter():
    """models/chat sits below tools/ and keeps the examples as text: they must equal what each formatter writes."""
    from thermik.models.chat import FALLBACK_CALL_EXAMPLES, FALLBACK_CALL_INSTRUCTIONS

    written = {name: fmt("function_name", {"argument_name": "value"}) for name, fmt in TOOL_CALL_FORMATTERS.items()}
    assert written == FALLBACK_CALL_EXAMPLES and set(FALLBACK_CALL_INSTRUCTIONS) == set(written)


@pytest.mark.parametrize("template", ["thermik", "qwen2_5", "llama3_1"])
def test_templates_that_render_tools_are_used_as_they_are(template, row):
    chat = make_chat(template)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ToolsIgnoredWarning)
        text = chat.render(row["prompt"], [CALCULATE_SCHEMA])
    assert text == chat.tokenizer.apply_chat_template(
        row["prompt"], tools=[CALCULATE_SCHEMA], tokenize=False, add_generation_prompt=True
    )


def test_a_template_that_drops_some_tools_is_an_error():
    tok = build_tokenizer()
    tok.chat_template = "{{ tools[0] | tojson if tools }}{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}"
    chat = ChatTokenizer(tok)
    other = {"type": "function", "function": {"name": "other_tool", "parameters": {}}}
    with pytest.raises(ValueError, match=r"dropped the tools other_tool; set model\.chat_template"):
        chat.render([{"role": "user", "content": "hi"}], [CALCULATE_SCHEMA, other])


def test_model_chat_template_overrides_the_model_template(tiny_model_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text((TEMPLATES / "qwen2_5.jinja").read_text())
    cfg = load_config(RunConfig, ["--model.path", str(tiny_model_dir), "--model.chat_template", str(template)])
    assert load_tokenizer(cfg.model.path, cfg.model.chat_template).chat_template == template.read_text()
    assert load_tokenizer(tiny_model_dir).chat_template != template.read_text()
    with pytest.raises(FileNotFoundError, match=r"model\.chat_template: .*missing\.jinja is not a file"):
        load_tokenizer(tiny_model_dir, tmp_path / "missing.jinja")


@pytest.mark.parametrize("template", ["smollm2", "qwen2_5", "llama3_1", pytest.param(REAL, marks=needs_real)])
@pytest.mark.filterwarnings("ignore::thermik.models.chat.ToolsIgnoredWarning")
def test_multi_turn_tool_episode_keeps_the_exact_prefix(template, row):
    """The agent loop's own invariant check passes (it runs inside run_episode), every turn's engine input is a
    prefix of the final sequence, and the accumulated ids equal a fresh render of the whole conversation: the
    injected default system prompt (SmolLM2, Qwen2.5), Llama's dated header and trimming change nothing."""
    chat = make_chat(template)
    truth = row["reward_spec"]["ground_truth"]
    call = format_hermes_tool_call("calculate", {"expression": row["extra_info"]["expression"]})
    texts = [call, f"<answer>{truth}</answer>"]
    traj, engine = play(chat, row, texts, LIMITS)
    assert (traj.reward, traj.num_turns, traj.env_metrics["tool_calls"]) == (1.0, 2, 1)
    full = traj.prompt_ids + traj.response_ids
    assert all(full[: len(p)] == p for p in engine.prompts)
    tools = [CALCULATE_SCHEMA]
    conversation = [*row["prompt"], {"role": "assistant", "content": call},
                    {"role": "tool", "name": "calculate", "content": str(truth)}]  # fmt: skip
    assert engine.prompts[1] == chat.encode(chat.render(conversation, tools))
    conversation.append({"role": "assistant", "content": texts[1]})
    assert full + chat.encode(chat.after_eos) == chat.encode(chat.render(conversation, tools, False))
    assert chat.encode_conversation(conversation, tools) == (full, [0] * len(traj.prompt_ids) + traj.loss_mask)


def test_llama3_trims_what_it_re_renders_so_thermik_accumulates_ids(row):
    """Llama-3.1's template strips assistant content: a re-render is not what was sampled. The agent loop never
    re-renders (it appends sampled ids), so its sequence keeps the sampled whitespace."""
    chat = make_chat("llama3_1")
    texts = [" <answer>1</answer> "]
    traj, _ = play(chat, row, texts, LIMITS)
    conversation = [*row["prompt"], {"role": "assistant", "content": texts[0]}]
    rerendered = chat.encode(chat.render(conversation, [CALCULATE_SCHEMA], False))
    assert traj.prompt_ids + traj.response_ids != rerendered
    assert traj.response_ids == [*chat.encode(texts[0]), chat.eos_id]


THINK = "<think>\nThe product first, so I ask the tool.\n</think>\n\n"


def test_qwen3_thinking_episode_keeps_think_tokens_in_history(row):
    """Qwen3 renders an empty <think> block into a *last* assistant turn only, so the observation delta can't be
    read off a plain prefix; thermik reads it after the sampled turn's eos. The sampled <think> stays in history."""
    chat = make_chat("qwen3")
    call = format_hermes_tool_call("calculate", {"expression": row["extra_info"]["expression"]})
    texts = [THINK + call, f"<answer>{row['reward_spec']['ground_truth']}</answer>"]
    traj, engine = play(chat, row, texts, LIMITS)
    assert (traj.reward, traj.num_turns) == (1.0, 2)
    assert THINK + call in chat.tokenizer.decode(engine.prompts[1])
    assert chat.tokenizer.decode(engine.prompts[1]).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_drops_old_thinking_on_re_render_but_the_sequence_keeps_it(row):
    """After a new user message (feedback), Qwen3's template drops earlier <think> content: a fresh rendering is not
    a continuation of what was sampled. The observation delta (SFT's encoding) keeps the sampled thinking; the agent
    loop starts a new step-wise sample there instead (tests/test_step_wise.py, docs/algorithms.md)."""
    chat = make_chat("qwen3")
    first = THINK + "<answer>1</answer>"
    feedback = [{"role": "user", "content": "Wrong, try again."}]
    ids = chat.encode_prompt(row["prompt"]) + chat.encode(first) + [chat.eos_id] + chat.encode_observations(feedback)
    conversation = [*row["prompt"], {"role": "assistant", "content": first}, *feedback]
    fresh = chat.encode(chat.render(conversation))
    assert "The product first" in chat.tokenizer.decode(ids)
    assert "The product first" not in chat.tokenizer.decode(fresh)
    assert chat.tokenizer.decode(ids).endswith("<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok = build_tokenizer()
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}"
    with pytest.raises(ValueError, match="not prefix-consistent: observations change earlier turns"):
        ChatTokenizer(tok).encode_observations([{"role": "user", "content": "x"}])


def test_server_chat_endpoint_keeps_tools_for_a_template_that_ignores_them(row):
    from thermik.inference.server.chat_render import render_chat
    from thermik.inference.server.protocol import ChatCompletionRequest

    tok = build_tokenizer()
    tok.chat_template = (TEMPLATES / "smollm2.jinja").read_text() + "{# server test #}"  # a template not yet probed
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": row["prompt"], "tools": [CALCULATE_SCHEMA]})
    with pytest.warns(ToolsIgnoredWarning, match="requests with tools get the tool schemas in the system message"):
        text = tok.decode(render_chat(tok, body))
    assert json.dumps(CALCULATE_SCHEMA["function"]) in text and text.startswith("<|im_start|>system\nUse the calc")

"""Tool-call parsers beyond the Hermes basics: Qwen3-Coder XML, Llama-3 JSON, schema repair, the table,
and a property test that no parser lets an exception escape on random or mutated text."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thermik.config.schema import EnvConfig
from thermik.tools.parsers import (
    TOOL_CALL_FORMATTERS,
    TOOL_PARSERS,
    ParsedToolCalls,
    ToolCall,
    coerce_value,
    format_llama3_tool_call,
    get_parser,
    parse_hermes_tool_calls,
    parse_llama3_tool_calls,
    parse_qwen3_coder_tool_calls,
    repair_arguments,
)

RUN_CODE = {
    "type": "function",
    "function": {
        "name": "run",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "timeout": {"type": "integer"},
                "ratio": {"type": "number"},
                "verbose": {"type": "boolean"},
                "files": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object"},
            },
            "required": ["code"],
        },
    },
}
TOOLS = [RUN_CODE]


# ---------------------------------------------------------------- hermes tolerance


def test_hermes_alias_is_renamed_only_with_a_schema():
    text = '<tool_call>{"name": "run", "arguments": {"python_code": "print(1)"}}</tool_call>'
    assert parse_hermes_tool_calls(text, TOOLS).calls == [ToolCall("run", {"code": "print(1)"})]
    assert parse_hermes_tool_calls(text).calls == [ToolCall("run", {"python_code": "print(1)"})]


def test_hermes_triple_encoded_openai_shape_and_code_fence():
    inner = json.dumps(json.dumps({"code": "x"}))
    text = f'<tool_call>\n```json\n{{"function": {{"name": "run", "arguments": {inner}}}}}\n```\n</tool_call>'
    assert parse_hermes_tool_calls(text).calls == [ToolCall("run", {"code": "x"})]


def test_hermes_error_kinds():
    kinds = [
        parse_hermes_tool_calls(f"<tool_call>{body}</tool_call>").errors[0].kind
        for body in ("", "{x", "[1]", '{"arguments": {}}', '{"name": "f", "arguments": [1]}', '{"name": "f"} junk')
    ]
    assert kinds == ["empty", "invalid_json", "not_an_object", "missing_name", "bad_arguments", "trailing_text"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"python_code": "a"}, {"code": "a"}),
        ({"source_code": "a", "timeout": 3}, {"code": "a", "timeout": 3}),
        ({"code": "a", "python_code": "b"}, {"code": "a", "python_code": "b"}),  # never overwrite
        ({"code_str": "a"}, {"code": "a"}),
        ({"unrelated": 1}, {"unrelated": 1}),
    ],
)
def test_repair_arguments(arguments, expected):
    assert repair_arguments("run", arguments, TOOLS) == expected
    assert repair_arguments("other_tool", arguments, TOOLS) == arguments


# ---------------------------------------------------------------- qwen3-coder XML


def test_qwen3_coder_values_coerced_by_schema():
    text = (
        "Let me run it.\n<tool_call>\n<function=run>\n<parameter=code>\nfor i in range(3):\n    print(i)\n"
        "</parameter>\n<parameter=timeout>\n5\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
        '<parameter=verbose>\nTrue\n</parameter>\n<parameter=files>\n["a.py"]\n</parameter>\n'
        '<parameter=options>\n{"x": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    parsed = parse_qwen3_coder_tool_calls(text, TOOLS)
    assert parsed.errors == []
    assert parsed.content == "Let me run it."
    assert parsed.calls == [
        ToolCall(
            "run",
            {
                "code": "for i in range(3):\n    print(i)",
                "timeout": 5,
                "ratio": 0.5,
                "verbose": True,
                "files": ["a.py"],
                "options": {"x": 1},
            },
        )
    ]


def test_qwen3_coder_missing_close_tags_and_no_wrapper():
    text = "<tool_call>\n<function=run>\n<parameter=code>\nprint(2)\n<parameter=timeout>\n7"
    assert parse_qwen3_coder_tool_calls(text, TOOLS).calls == [ToolCall("run", {"code": "print(2)", "timeout": 7})]
    bare = "<function=run><parameter=python_code>x</parameter></function>"
    assert parse_qwen3_coder_tool_calls(bare, TOOLS).calls == [ToolCall("run", {"code": "x"})]


def test_qwen3_coder_value_that_does_not_fit_stays_text_and_bad_blocks_are_errors():
    parsed = parse_qwen3_coder_tool_calls("<tool_call><function=run><parameter=timeout>soon</parameter></function>")
    assert parsed.calls == [ToolCall("run", {"timeout": "soon"})]  # no schema: text
    assert coerce_value("soon", {"type": "integer"}) == "soon"
    assert coerce_value("3", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) == 3
    assert parse_qwen3_coder_tool_calls("<tool_call>no function here</tool_call>").errors[0].kind == "missing_name"
    assert parse_qwen3_coder_tool_calls("<tool_call><function=>x</function></tool_call>").errors[0].kind == (
        "missing_name"
    )


# ---------------------------------------------------------------- llama-3 JSON


def test_llama3_plain_tagged_and_several_calls():
    plain = '{"name": "run", "parameters": {"code": "1"}}'
    assert parse_llama3_tool_calls(plain).calls == [ToolCall("run", {"code": "1"})]
    tagged = 'Sure.<|python_tag|>{"name": "run", "parameters": {"python_code": "2"}}; {"name": "b", "arguments": {}}'
    parsed = parse_llama3_tool_calls(tagged + "<|eom_id|>", TOOLS)
    assert parsed.calls == [ToolCall("run", {"code": "2"}), ToolCall("b", {})]
    assert parsed.content == "Sure."


def test_llama3_format_escapes_the_python_tag():
    text = format_llama3_tool_call("run", {"code": "<|python_tag|>"})
    assert "<|python_tag|>" not in text
    assert parse_llama3_tool_calls(text).calls == [ToolCall("run", {"code": "<|python_tag|>"})]


def test_llama3_text_is_not_a_call_and_bad_json_is_an_error():
    assert not parse_llama3_tool_calls("The answer is 4.").found
    bad = parse_llama3_tool_calls('{"name": "run", "parameters": {"code": ')
    assert bad.errors[0].kind == "invalid_json" and not bad.calls
    assert parse_llama3_tool_calls("<|python_tag|>").errors[0].kind == "empty"
    assert parse_llama3_tool_calls("<|python_tag|>[1]").errors[0].kind == "not_an_object"


# ---------------------------------------------------------------- table and config


def test_parser_table_matches_config_and_unknown_name_lists_valid_ones():
    literal = EnvConfig.model_fields["tool_parser"].annotation.__args__
    assert set(literal) == set(TOOL_PARSERS) == set(TOOL_CALL_FORMATTERS)
    assert get_parser("llama3") is parse_llama3_tool_calls
    with pytest.raises(ValueError, match="hermes, llama3, qwen3_coder"):
        get_parser("mistral")


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_format_round_trips_through_its_parser(name):
    arguments = {"code": "print('hi')\n", "timeout": 3, "verbose": False, "files": ["a", "b"]}
    text = TOOL_CALL_FORMATTERS[name]("run", arguments)
    assert TOOL_PARSERS[name](text, TOOLS).calls == [ToolCall("run", arguments)]


# ---------------------------------------------------------------- property: never raises

_ALPHABET = '<>/{}[]":,;=_ \n\\0123abcfnmprstuvwxyz|'
_SEEDS = [TOOL_CALL_FORMATTERS[n]("run", {"code": "x", "timeout": 1}) for n in sorted(TOOL_CALL_FORMATTERS)] + [
    "<|python_tag|>",
    "<tool_call><function=a><parameter=b>",
]


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(4)
        i = rng.randrange(len(chars) + 1)
        if op == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == 1:
            chars.insert(i, rng.choice(_ALPHABET))
        elif op == 2 and chars:
            j = rng.randrange(len(chars))
            chars[j:j] = chars[j : j + rng.randint(1, 12)]  # duplicate a slice
        else:
            chars = chars[:i]  # truncate, as a length cut-off does
    return "".join(chars)


def _check(parsed: ParsedToolCalls) -> None:
    assert isinstance(parsed, ParsedToolCalls)
    assert all(isinstance(c.name, str) and c.name and isinstance(c.arguments, dict) for c in parsed.calls)
    assert all(e.message and e.kind for e in parsed.errors)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_thousands_of_mutated_calls_never_raise(name):
    rng = random.Random(name)
    parser = TOOL_PARSERS[name]
    for i in range(3000):
        _check(parser(_mutate(_SEEDS[i % len(_SEEDS)], rng), TOOLS if i % 2 else None))


@settings(max_examples=400, deadline=None)
@given(st.text(), st.text(alphabet=_ALPHABET, max_size=120), st.sampled_from(sorted(TOOL_PARSERS)))
def test_random_text_never_raises(prefix, body, name):
    parser = TOOL_PARSERS[name]
    for text in (prefix, prefix + body, f"<tool_call>{body}", f"<|python_tag|>{body}", f"<function={body}"):
        _check(parser(text, TOOLS))
    _check(parser(None, TOOLS))  # type: ignore[arg-type]

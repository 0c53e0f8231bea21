"""A seeded generator of tool-call text for fuzzing the parsers: well-formed calls of every format, then spliced,
truncated, duplicated and salted with tags, broken JSON, deep nesting, odd numbers and odd Unicode."""

from __future__ import annotations

import json
import random
from typing import Any

from thermik.tools.parsers import TOOL_CALL_FORMATTERS

TAGS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">", "\n",
        "<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "```json\n", "```", ";", ",", "{", "}", "[", "]", '"', ":",
        "\\", "\\u003c", "\\ud800", "\\udfff", "NaN", "Infinity", "-Infinity", "1e999", "null", "true"]  # fmt: skip
ODD_TEXT = ["\x00", "\ud800", "\udfff", "é", "\u202e", "\ufeff", "🙂", "\r\n", "\t", " " * 50, "名前"]
NAMES = ["add", "calculate", "echo", "", " ", "a" * 300, "name with space", "\ud800", "<tool_call>", "0"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.randint(-(2**70), 2**70)
    if kind == 1:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf")])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        return "".join(rng.choice(ODD_TEXT + TAGS + ["x", "y", "7"]) for _ in range(rng.randrange(6)))
    if kind in (6, 7):
        return {rng.choice(["a", "b", "code", "python_code", "", "\ud800"]): _value(rng, depth + 1) for _ in range(3)}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def well_formed(rng: random.Random) -> str:
    """One or more calls in one format (arguments may hold NaN, huge ints, tags and lone surrogates)."""
    fmt = TOOL_CALL_FORMATTERS[rng.choice(sorted(TOOL_CALL_FORMATTERS))]
    calls = []
    for _ in range(rng.randrange(1, 4)):
        arguments = {rng.choice(["a", "b", "text", "code"]): _value(rng) for _ in range(rng.randrange(3))}
        try:
            calls.append(fmt(rng.choice(NAMES), arguments))
        except (ValueError, TypeError, UnicodeError):  # a formatter refusing a value is not what is fuzzed
            calls.append(json.dumps({"name": "add", "arguments": {}}))
    return rng.choice(["\n", "", ";", " "]).join(calls)


def mutate(rng: random.Random, text: str) -> str:
    """Splice, cut, duplicate or salt `text` a few times."""
    for _ in range(rng.randrange(4)):
        pos = rng.randrange(len(text) + 1)
        op = rng.randrange(6)
        if op == 0:
            text = text[:pos]
        elif op == 1:
            text = text[:pos] + rng.choice(TAGS + ODD_TEXT) + text[pos:]
        elif op == 2:
            text = text[:pos] + text[pos : pos + rng.randrange(40)] * 2 + text[pos:]
        elif op == 3:
            text = text[pos:] + text[:pos]
        elif op == 4:
            depth = rng.choice([10, 1000, 5000])
            text = text[:pos] + "[" * depth + "]" * rng.choice([0, depth]) + text[pos:]
        else:
            text = text[:pos] + "".join(rng.choice(TAGS) for _ in range(rng.randrange(1, 8))) + text[pos:]
    return text


def cases(seed: int, count: int) -> list[str]:
    """`count` fuzz strings from `seed`: a quarter well-formed, the rest mutated or tag soup."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        base = well_formed(rng)
        if i % 4 == 0:
            out.append(base)
        elif i % 4 == 3:
            out.append("".join(rng.choice(TAGS + ODD_TEXT + ["add", "x"]) for _ in range(rng.randrange(60))))
        else:
            out.append(mutate(rng, rng.choice(["prose ", ""]) + base + rng.choice(["", " done", "<tool_call>"])))
    return out

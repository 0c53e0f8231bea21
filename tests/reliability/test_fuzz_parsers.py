"""Every tool-call parser gets generated strings (seeded): no exception, and every block comes back as a
call (a non-empty name, a dict of arguments) or a typed parse error, in block order.

Bounded in CI (FUZZ_CASES_CI per parser, a few seconds); `RELIABILITY_FULL=1` runs FUZZ_CASES_FULL per parser
(or `RELIABILITY_FUZZ_CASES=N`). `python tests/reliability/kill_suite.py --kills 0 --fuzz-cases N` prints them.
"""

from __future__ import annotations

import os
import time
import typing

import pytest
from fuzz_inputs import cases

from thermik.tools.parsers import TOOL_PARSERS, ParsedToolCalls, ParseErrorKind, ToolCall, ToolParseError

FUZZ_CASES_CI = 10_000
FUZZ_CASES_FULL = 100_000
ERROR_KINDS = set(typing.get_args(ParseErrorKind))
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": ["number", "null"]}, "code": {"type": "string"}}}}}]  # fmt: skip


def fuzz_count() -> int:
    if os.environ.get("RELIABILITY_FUZZ_CASES"):
        return int(os.environ["RELIABILITY_FUZZ_CASES"])
    return FUZZ_CASES_FULL if os.environ.get("RELIABILITY_FULL") == "1" else FUZZ_CASES_CI


def check(parsed: ParsedToolCalls) -> None:
    assert isinstance(parsed, ParsedToolCalls) and isinstance(parsed.content, str)
    for item in parsed.items:
        if isinstance(item, ToolCall):
            assert isinstance(item.name, str) and item.name.strip(), item
            assert isinstance(item.arguments, dict), item
        else:
            assert isinstance(item, ToolParseError), item
            assert item.kind in ERROR_KINDS and item.message and isinstance(item.raw, str), item
    assert parsed.calls == [i for i in parsed.items if isinstance(i, ToolCall)]
    assert parsed.errors == [i for i in parsed.items if isinstance(i, ToolParseError)]


def run_fuzz(name: str, count: int, seed: int = 18) -> dict[str, float]:
    """Feed `count` cases to parser `name`; returns the figures (exceptions are counted, not raised)."""
    parser, exceptions, calls, errors = TOOL_PARSERS[name], 0, 0, 0
    t0 = time.perf_counter()
    for i, text in enumerate(cases(seed, count)):
        try:
            parsed = parser(text, TOOLS if i % 2 else None)
            check(parsed)
        except Exception as exc:
            exceptions += 1
            if exceptions == 1:
                print(f"{name}: first failure on {text[:200]!r}: {exc!r}")
            continue
        calls += len(parsed.calls)
        errors += len(parsed.errors)
    return {"cases": count, "exceptions": exceptions, "calls": calls, "parse_errors": errors,
            "seconds": time.perf_counter() - t0}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_parsers_survive_generated_strings(name):
    figures = run_fuzz(name, fuzz_count())
    print(name, figures)
    assert figures["exceptions"] == 0
    assert figures["calls"] > 0 and figures["parse_errors"] > 0  # the generator reaches both outcomes

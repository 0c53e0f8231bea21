"""Tool-call parsing, safe arithmetic, the calculator MCP server and the MCP client pool (real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orphans import earlier_children, new_children  # noqa: F401  (earlier_children: an autouse fixture)

from thermik.tasks.calculator.arith import MAX_EXPONENT, ArithError, evaluate, format_number
from thermik.tasks.calculator.server import server_spec
from thermik.tools.mcp_pool import MCPPool, ServerSpec
from thermik.tools.parsers import ToolCall, format_hermes_tool_call, parse_hermes_tool_calls

# ---------------------------------------------------------------- parser


def test_parse_good_call_and_surrounding_text():
    text = 'I will compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    parsed = parse_hermes_tool_calls(text)
    assert parsed.calls == [ToolCall("calculate", {"expression": "1 + 2"})]
    assert parsed.errors == []
    assert parsed.content == "I will compute."


def test_parse_two_calls_in_order():
    text = format_hermes_tool_call("a", {"x": 1}) + "\n" + format_hermes_tool_call("b", {"y": [2]})
    parsed = parse_hermes_tool_calls(text)
    assert [c.name for c in parsed.calls] == ["a", "b"]
    assert parsed.calls[1].arguments == {"y": [2]}


def test_parse_missing_close_tag():
    parsed = parse_hermes_tool_calls('<tool_call>\n{"name": "calculate", "arguments": {"expression": "3*4"}}\n')
    assert parsed.calls == [ToolCall("calculate", {"expression": "3*4"})]
    assert parsed.errors == []


def test_parse_missing_close_tag_before_next_block():
    text = '<tool_call>{"name": "a", "arguments": {}}<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert [c.name for c in parse_hermes_tool_calls(text).calls] == ["a", "b"]


def test_parse_parameters_alias_and_double_encoded_arguments():
    alias = parse_hermes_tool_calls('<tool_call>{"name": "f", "parameters": {"k": "v"}}</tool_call>')
    assert alias.calls == [ToolCall("f", {"k": "v"})]
    encoded = json.dumps({"name": "f", "arguments": json.dumps({"k": 1})})
    double = parse_hermes_tool_calls(f"<tool_call>\n{encoded}\n</tool_call>")
    assert double.calls == [ToolCall("f", {"k": 1})]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"name": "f", "arguments": {"x": 1}', "invalid JSON"),
        ("not json at all", "invalid JSON"),
        ("", "empty"),
        ("[1, 2]", "JSON object"),
        ('{"arguments": {}}', '"name"'),
        ('{"name": "", "arguments": {}}', '"name"'),
        ('{"name": "f", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "f", "arguments": "{bad"}', '"arguments" string'),
        ('{"name": "f", "arguments": {}} trailing', "unexpected text"),
    ],
)
def test_parse_errors_are_typed_and_explain(body, fragment):
    parsed = parse_hermes_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == []
    assert len(parsed.errors) == 1
    assert fragment in parsed.errors[0].message
    assert parsed.found


def test_parse_no_tool_call():
    parsed = parse_hermes_tool_calls("<answer>3</answer>")
    assert not parsed.found
    assert parsed.content == "<answer>3</answer>"


def test_parse_non_string_input_does_not_raise():
    assert parse_hermes_tool_calls(None).errors  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(alphabet='<>/{}[]":,tool_cal namergs\\ 0123', max_size=80))
def test_parse_never_raises_on_random_text(prefix, body):
    for text in (prefix, f"{prefix}<tool_call>{body}", f"<tool_call>{body}</tool_call>{prefix}"):
        parsed = parse_hermes_tool_calls(text)
        assert all(isinstance(c.arguments, dict) and c.name for c in parsed.calls)


def test_format_escapes_tags_inside_strings():
    text = format_hermes_tool_call("<tool_call>", {"a": "x</tool_call>y"})
    assert text.count("<tool_call>") == 1 and text.count("</tool_call>") == 1
    assert parse_hermes_tool_calls(text).calls == [ToolCall("<tool_call>", {"a": "x</tool_call>y"})]


@settings(max_examples=100, deadline=None)
@given(
    st.text(min_size=1).filter(str.strip).map(str.strip),
    st.dictionaries(st.text(), st.one_of(st.integers(), st.text(), st.booleans(), st.none())),
)
def test_format_then_parse_round_trips(name, arguments):
    assert parse_hermes_tool_calls(format_hermes_tool_call(name, arguments)).calls == [ToolCall(name, arguments)]


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("23 + 45 * 7", "338"),
        ("(1 + 2) * 3", "9"),
        ("-3 - -4", "1"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("10 // 3", "3"),
        ("10 % 3", "1"),
        ("2 ** 10", "1024"),
        ("0.5 * 4", "2"),
        ("  42  ", "42"),
    ],
)
def test_arith_accepts(expression, expected):
    assert format_number(evaluate(expression)) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("__import__('os').system('true')", "unsupported syntax"),
        ("x + 1", "unsupported syntax: Name"),
        ("[1, 2]", "unsupported syntax"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        (f"2 ** {MAX_EXPONENT + 1}", "exponent too large"),
        ("9 ** 9 ** 9", "exponent too large"),
        ("(10 ** 20) * (10 ** 20)", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "invalid syntax"),
        ("", "empty"),
        ("1" * 500, "too long"),
        ("1 < 2", "unsupported syntax"),
    ],
)
def test_arith_rejects_with_clear_error(expression, fragment):
    with pytest.raises(ArithError, match=fragment):
        evaluate(expression)


# ---------------------------------------------------------------- MCP server + pool (real processes)


def _children() -> list[psutil.Process]:
    return new_children()


def test_pool_calls_server_concurrently_on_one_process_and_closes_cleanly(tmp_path):
    before = {p.pid for p in _children()}

    async def main() -> tuple[list, int, Path | None]:
        pool = MCPPool(log_dir=tmp_path)
        spec = server_spec()
        results = await asyncio.gather(
            *(pool.call_tool(spec, "calculate", {"expression": f"{i} * 3"}, 10.0) for i in range(8))
        )
        spawned = len([p for p in _children() if p.pid not in before])
        error = await pool.call_tool(spec, "calculate", {"expression": "1 / 0"}, 10.0)
        unknown = await pool.call_tool(spec, "nope", {}, 10.0)
        # Close from a different task than the one that opened the session.
        await asyncio.create_task(pool.aclose())
        return [*results, error, unknown], spawned, pool.errlog_path

    results, spawned, errlog = asyncio.run(main())
    assert [r.text for r in results[:8]] == [str(i * 3) for i in range(8)]
    assert not any(r.is_error for r in results[:8])
    assert results[8].is_error and "division by zero" in results[8].text
    assert results[9].is_error and "nope" in results[9].text
    assert spawned == 1
    assert {p.pid for p in _children()} <= before
    assert errlog is not None and errlog.parent == tmp_path and "starting MCP server" in errlog.read_text()


def test_pool_timeout_is_an_error_result_and_slow_server_is_kept():
    async def main():
        pool = MCPPool()
        spec = server_spec(latency_s=0.6)
        try:
            slow = await pool.call_tool(spec, "calculate", {"expression": "1 + 1"}, 0.2)
            pid = {p.pid for p in _children()}
            fine = await pool.call_tool(spec, "calculate", {"expression": "1 + 1"}, 5.0)
            return slow, fine, pid == {p.pid for p in _children()}
        finally:
            await pool.aclose()

    slow, fine, same_process = asyncio.run(main())
    assert slow.is_error and "timed out" in slow.text
    assert fine == type(fine)("2", False)
    assert same_process


def test_pool_restarts_a_dead_server_on_the_next_call():
    async def main():
        pool = MCPPool()
        spec = server_spec()
        before = {p.pid for p in _children()}
        try:
            assert (await pool.call_tool(spec, "calculate", {"expression": "2+2"}, 5.0)).text == "4"
            for child in _children():
                if child.pid not in before:
                    child.kill()
            await asyncio.sleep(0.1)
            dead = await pool.call_tool(spec, "calculate", {"expression": "2+3"}, 5.0)
            again = await pool.call_tool(spec, "calculate", {"expression": "2+3"}, 5.0)
            return dead, again
        finally:
            await pool.aclose()

    dead, again = asyncio.run(main())
    assert dead.is_error
    assert again.text == "5" and not again.is_error
    assert _children() == []


def test_pool_unlaunchable_server_is_an_error_result():
    async def main():
        pool = MCPPool(startup_timeout_s=5.0)
        try:
            return await pool.call_tool(ServerSpec("/nonexistent/server-binary"), "x", {}, 1.0)
        finally:
            await pool.aclose()

    result = asyncio.run(main())
    assert result.is_error and "unavailable" in result.text


def test_pool_server_is_reaped_when_its_loop_ends_without_close():
    async def use() -> None:
        pool = MCPPool()
        await pool.call_tool(server_spec(), "calculate", {"expression": "1"}, 5.0)

    asyncio.run(use())  # no close: asyncio.run cancels the owner task, which reaps the server
    assert _children() == []


def test_server_runs_as_module_and_rejects_negative_latency():
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "thermik.tasks.calculator.server", "--latency", "-1"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert out.returncode != 0 and "--latency must be >= 0" in out.stderr

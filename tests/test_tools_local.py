"""@tool / ToolGroup schemas and calls, and the Toolbox routing across local tools and a real MCP server."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import pytest
from fixtures.faulty_server import server_spec

from thermik.tools.local import ToolGroup, parse_docstring, tool
from thermik.tools.mcp_pool import MCPPool
from thermik.tools.parsers import ToolCall
from thermik.tools.toolbox import Toolbox, ToolNameCollision


@tool
def search(query: str, top_k: int = 3, mode: Literal["bm25", "exact"] = "bm25", tags: list[str] | None = None) -> str:
    """Search the corpus for passages.

    Longer explanation that is not part of the summary.

    Args:
        query: What to look for,
            over two lines.
        top_k (int): How many passages to return.
        mode: Ranking method.

    Returns:
        The passages.
    """
    return f"{query}|{top_k}|{mode}|{tags}"


@tool(name="slow_echo")
async def _slow(text: str, seconds: float = 0.0) -> str:
    """Echo after a delay."""
    await asyncio.sleep(seconds)
    return text


def test_schema_from_hints_and_docstring():
    spec = search.spec()["function"]
    assert spec["name"] == "search"
    assert spec["description"] == "Search the corpus for passages."
    params = spec["parameters"]
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for, over two lines."}
    assert props["top_k"]["type"] == "integer" and props["top_k"]["default"] == 3
    assert props["top_k"]["description"] == "How many passages to return."
    assert props["mode"]["enum"] == ["bm25", "exact"]
    assert "title" not in params and all("title" not in p for p in props.values())
    assert "description" not in props["tags"]  # no docstring entry: no description invented


def test_parse_docstring_sections():
    doc = "Do it.\n\nArgs:\n    a: first\n    b (str): second\n        continued\nRaises:\n    X"
    summary, args = parse_docstring(doc)
    assert summary == "Do it." and args == {"a": "first", "b": "second continued"}


def test_sync_and_async_calls_validate_arguments():
    async def main():
        ok = await search.call({"query": "q", "top_k": "5"})  # lax coercion, as pydantic does
        bad = await search.call({"query": "q", "top_k": "many"})
        extra = await search.call({"query": "q", "nope": 1})
        missing = await search.call({})
        echoed = await _slow.call({"text": "hi"})
        return ok, bad, extra, missing, echoed

    ok, bad, extra, missing, echoed = asyncio.run(main())
    assert ok.text == "q|5|bm25|None" and not ok.is_error
    assert bad.is_error and "top_k" in bad.text
    assert extra.is_error and "nope" in extra.text
    assert missing.is_error and "query" in missing.text
    assert echoed.text == "hi" and not echoed.is_error


def test_tool_errors_and_bad_definitions():
    @tool
    def boom(x: int) -> int:
        """Fails."""
        raise RuntimeError(f"bad x={x}")

    result = asyncio.run(boom.call({"x": 2}))
    assert result.is_error and result.text == "RuntimeError: bad x=2"
    with pytest.raises(TypeError, match="type hint"):
        tool(name="f")(lambda x: x)
    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def star(*xs: int) -> int:
            return 0

    with pytest.raises(ValueError, match="tool name"):
        tool(name="has space")(search.fn)


def test_tool_group_rejects_duplicates():
    group = ToolGroup("g")

    @group.tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    assert [s["function"]["name"] for s in group.specs()] == ["add"]
    with pytest.raises(ValueError, match="already has a tool named 'add'"):
        group.add(add.fn)


def test_toolbox_routes_local_and_mcp_and_rejects_collisions(tmp_path):
    async def main():
        pool = MCPPool(log_dir=tmp_path)
        box = Toolbox(pool, timeout_s=0.5, max_output_chars=50)
        try:
            box.add_local(search)
            box.add_local(_slow)
            names = await box.add_server(server_spec(), only=["echo", "add", "big_output"])
            with pytest.raises(ToolNameCollision, match="'echo'"):
                await box.add_server(server_spec(), only=["echo"])
            with pytest.raises(ToolNameCollision, match="'search'"):
                box.add_local(search)
            with pytest.raises(ValueError, match="no tool"):
                await box.add_server(server_spec(), only=["missing_tool"])
            results = {
                "local": await box.call(ToolCall("search", {"query": "a"})),
                "mcp": await box.call(ToolCall("add", {"a": 2, "b": 3})),
                "unknown": await box.call(ToolCall("nope", {})),
                "bad_args": await box.call(ToolCall("add", {"a": "two", "b": 3})),
                "missing": await box.call(ToolCall("echo", {})),
                "big": await box.call(ToolCall("big_output", {"chars": 10_000})),
            }
            t0 = time.perf_counter()
            results["timeout"] = await box.call(ToolCall("slow_echo", {"text": "x", "seconds": 5}))
            elapsed = time.perf_counter() - t0
            return names, box.names, box.specs, results, elapsed
        finally:
            await box.aclose()
            await pool.aclose()

    names, all_names, specs, r, elapsed = asyncio.run(main())
    assert names == ["echo", "add", "big_output"]
    assert all_names == ["search", "slow_echo", "echo", "add", "big_output"]
    assert [s["function"]["name"] for s in specs] == all_names
    assert r["local"].text == "a|3|bm25|None"
    assert r["mcp"].text == "5" and not r["mcp"].is_error
    assert r["unknown"].is_error and "available tools: search, slow_echo, echo" in r["unknown"].text
    assert r["bad_args"].is_error and "a: 'two' is not of type 'integer'" in r["bad_args"].text
    assert r["missing"].is_error and "'text' is a required property" in r["missing"].text
    assert r["big"].text.startswith("x" * 50) and r["big"].text.endswith("[truncated 9950 chars]")
    assert r["timeout"].is_error and "timed out after 0.5s" in r["timeout"].text and elapsed < 2

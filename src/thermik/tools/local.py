"""Local Python tools: `@tool` turns a typed, documented function into a tool; `ToolGroup` names a set.

The JSON schema comes from the type hints (through pydantic, which also validates the arguments
of each call) and the docstring: its first paragraph is the description and an `Args:` section
(Google style, `name: text` or `name (type): text`) gives each parameter's description.
Sync and async functions both work; a sync function runs in a worker thread so it cannot
stall the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

import pydantic

from thermik.tools.mcp_pool import ToolResult


@dataclass(frozen=True)
class LocalTool:
    """One Python function exposed as a tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    arguments_model: type[pydantic.BaseModel]

    def spec(self) -> dict[str, Any]:
        """OpenAI function format, as the chat template renders it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        """Validate `arguments` against the signature, run the function; errors become error results."""
        try:
            validated = self.arguments_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            return ToolResult(text=f"bad arguments for '{self.name}': {_validation_message(exc)}", is_error=True)
        kwargs = {key: getattr(validated, key) for key in type(validated).model_fields}
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(**kwargs)
            else:
                value = await asyncio.to_thread(self.fn, **kwargs)
        except Exception as exc:  # the tool's own failure is the model's observation, not a crash
            return ToolResult(text=f"{type(exc).__name__}: {exc}", is_error=True)
        return ToolResult(text=_to_text(value), is_error=False)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Decorator: `@tool` or `@tool(name=..., description=...)` -> LocalTool."""

    def wrap(func: Callable[..., Any]) -> LocalTool:
        return make_tool(func, name=name, description=description)

    return wrap(fn) if fn is not None else wrap


def make_tool(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> LocalTool:
    """Build a LocalTool from a function's signature, type hints and docstring."""
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", tool_name):
        raise ValueError(f"tool name must be 1-64 letters, digits, '_', '.', '-', got {tool_name!r}")
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args/**kwargs cannot be described by a schema")
        if param.name not in hints:
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} needs a type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints[param.name], pydantic.Field(default, description=arg_docs.get(param.name)))
    model = pydantic.create_model(f"{tool_name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    return LocalTool(
        name=tool_name,
        description=description or summary,
        parameters=_clean_schema(model.model_json_schema()),
        fn=fn,
        arguments_model=model,
    )


class ToolGroup:
    """A named set of local tools: `group = ToolGroup("math"); @group.tool def add(a: int, b: int) -> int`."""

    def __init__(self, name: str, tools: Iterable[LocalTool | Callable[..., Any]] = ()) -> None:
        self.name = name
        self.tools: dict[str, LocalTool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: LocalTool | Callable[..., Any]) -> LocalTool:
        local = item if isinstance(item, LocalTool) else make_tool(item)
        if local.name in self.tools:
            raise ValueError(f"tool group {self.name!r} already has a tool named {local.name!r}")
        self.tools[local.name] = local
        return local

    def tool(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """Decorator adding a function to this group; returns the LocalTool."""

        def wrap(func: Callable[..., Any]) -> LocalTool:
            return self.add(make_tool(func, name=name))

        return wrap(fn) if fn is not None else wrap

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]


_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from a Google-style docstring."""
    first = doc.strip().split("\n\n")[0]
    summary = "" if first.strip() in _ARGS_HEADERS else " ".join(first.split())
    args: dict[str, str] = {}
    lines = doc.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() in _ARGS_HEADERS), None)
    if start is None:
        return summary, args
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the next section (Returns:, Raises:) starts at the left margin
        entry_indent = indent if entry_indent is None else entry_indent
        match = _ARG_LINE.match(line.strip())
        if indent <= entry_indent and match:
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif current is not None:  # a deeper line continues the previous entry
            args[current] = f"{args[current]} {line.strip()}".strip()
    return summary, args


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's schema without the `title` noise; `$defs` stay (nested models need them)."""
    if isinstance(schema, dict):
        return {k: _clean_schema(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_clean_schema(v) for v in schema]  # type: ignore[return-value]
    return schema


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)

"""Tool-call parsers: model text -> ToolCall list. Hermes/Qwen format.

`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; a missing close tag,
`parameters` instead of `arguments` and arguments given as a JSON string are tolerated.
Parsing never raises: each bad block becomes a ToolParseError whose message is fit to show
the model as the tool observation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolParseError:
    """One `<tool_call>` block that could not be read; `raw` is the block's text."""

    message: str
    raw: str


@dataclass(frozen=True)
class ParsedToolCalls:
    """Calls and errors in the order the blocks appear; `content` is the text outside the blocks."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolParseError] = field(default_factory=list)
    content: str = ""

    @property
    def found(self) -> bool:
        """True when the text contained at least one `<tool_call>` block, good or bad."""
        return bool(self.calls or self.errors)


def format_hermes_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The exact text a model emits for one call (inverse of parse_hermes_tool_calls)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def parse_hermes_tool_calls(text: str) -> ParsedToolCalls:
    """Parse every `<tool_call>` block in `text`. Never raises."""
    if not isinstance(text, str):
        return ParsedToolCalls(errors=[ToolParseError(f"expected text, got {type(text).__name__}", repr(text))])
    calls: list[ToolCall] = []
    errors: list[ToolParseError] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        close = text.find(TOOL_CALL_CLOSE, body_start)
        next_open = text.find(TOOL_CALL_OPEN, body_start)
        closed = close != -1 and (next_open == -1 or close < next_open)
        if closed:
            body, pos = text[body_start:close], close + len(TOOL_CALL_CLOSE)
        else:
            end = next_open if next_open != -1 else len(text)
            body, pos = text[body_start:end], end
        result = _parse_block(body, strict=closed)
        if isinstance(result, ToolCall):
            calls.append(result)
        else:
            errors.append(result)
    outside.append(text[pos:])
    return ParsedToolCalls(calls=calls, errors=errors, content="".join(outside).strip())


def _parse_block(body: str, strict: bool) -> ToolCall | ToolParseError:
    """One block body. `strict`: the block was closed, so nothing but the JSON object may be inside."""
    stripped = body.strip()
    if not stripped:
        return ToolParseError("empty <tool_call> block", body)
    try:
        obj, end = json.JSONDecoder().raw_decode(stripped)
    except (ValueError, RecursionError) as exc:
        return ToolParseError(f"invalid JSON in <tool_call>: {_short(exc)}", body)
    if strict and stripped[end:].strip():
        return ToolParseError("unexpected text after the JSON object in <tool_call>", body)
    if not isinstance(obj, dict):
        return ToolParseError(f"<tool_call> must hold a JSON object, got {type(obj).__name__}", body)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolParseError('<tool_call> needs a non-empty string "name"', body)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Double-encoded arguments ('"arguments": "{\"x\": 1}"') are common in model output.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            return ToolParseError(f'invalid JSON in "arguments" string: {_short(exc)}', body)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolParseError(f'"arguments" must be a JSON object, got {type(arguments).__name__}', body)
    return ToolCall(name=name.strip(), arguments=arguments)


def _short(exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    return message if len(message) <= 120 else message[:117] + "..."

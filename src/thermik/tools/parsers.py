"""Tool-call parsers: model text -> ToolCall list, one parser per text format, chosen by name.

Formats (FIELD-NOTES, "Tool-call text formats"):

- `hermes` (Hermes, Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- `qwen3_coder`: `<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>`;
  values are text, coerced to the type the tool's schema gives.
- `llama3` (Llama 3.1 JSON): the message is `{"name": ..., "parameters": {...}}` (several may follow
  one another, separated by `;`), optionally after `<|python_tag|>`.

Each parser tolerates what models really emit (a missing close tag, `parameters` instead of
`arguments`, arguments double-encoded as a JSON string, JSON in a code fence, common argument
aliases such as `python_code` for `code` when the tool's schema is known) and never raises:
each unreadable block becomes a ToolParseError whose message is fit to show the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

ParseErrorKind = Literal[
    "bad_input", "empty", "invalid_json", "not_an_object", "missing_name", "bad_arguments", "trailing_text"
]
ToolSchemas = Sequence[dict[str, Any]]
"""OpenAI function specs ({"type": "function", "function": {"name", "parameters"}}) or bare function dicts."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolParseError:
    """One tool-call block that could not be read; `raw` is the block's text, `kind` says what was wrong."""

    message: str
    raw: str
    kind: ParseErrorKind = "invalid_json"


@dataclass(frozen=True)
class ParsedToolCalls:
    """Calls and errors in the order the blocks appear; `content` is the text outside the blocks."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolParseError] = field(default_factory=list)
    content: str = ""
    items: list[ToolCall | ToolParseError] = field(default_factory=list)
    """Calls and errors together in block order: observations answer them in this order."""

    @classmethod
    def of(cls, items: list[ToolCall | ToolParseError], content: str = "") -> ParsedToolCalls:
        calls = [item for item in items if isinstance(item, ToolCall)]
        errors = [item for item in items if isinstance(item, ToolParseError)]
        return cls(calls=calls, errors=errors, content=content, items=list(items))

    @property
    def found(self) -> bool:
        """True when the text contained at least one tool-call block, good or bad."""
        return bool(self.calls or self.errors)


ToolCallParser = Callable[[str, "ToolSchemas | None"], ParsedToolCalls]


def format_hermes_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The exact text a model emits for one call (inverse of parse_hermes_tool_calls)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    # A tag inside a JSON string would end the block early; `\u003c` is the same string to a JSON reader.
    for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE):
        body = body.replace(tag, "\\u003c" + tag[1:])
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def format_qwen3_coder_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Qwen3-Coder XML for one call; non-string values are written as JSON. The format has no escape: a value
    holding `</parameter>` cannot round-trip."""
    params = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"{TOOL_CALL_OPEN}\n<function={name}>\n{params}</function>\n{TOOL_CALL_CLOSE}"


def format_llama3_tool_call(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    return body.replace(PYTHON_TAG, "\\u003c" + PYTHON_TAG[1:])


# ---------------------------------------------------------------- hermes


def parse_hermes_tool_calls(text: str, tools: ToolSchemas | None = None) -> ParsedToolCalls:
    """Parse every `<tool_call>` JSON block in `text`. Never raises."""
    if not isinstance(text, str):
        return _bad_input(text)
    blocks, content = _scan_blocks(text)
    items: list[ToolCall | ToolParseError] = []
    for body, closed in blocks:
        result = _parse_json_block(body, strict=closed)
        if isinstance(result, dict):
            result = _call_from_object(result, body)
        items.append(_repaired(result, tools))
    return ParsedToolCalls.of(items, content)


def _scan_blocks(
    text: str, open_tag: str = TOOL_CALL_OPEN, close_tag: str = TOOL_CALL_CLOSE
) -> tuple[list[tuple[str, bool]], str]:
    """(block bodies with whether each was closed, text outside the blocks). An unclosed block ends at
    the next open tag or the end of the text."""
    blocks: list[tuple[str, bool]] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(open_tag, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(open_tag)
        close = text.find(close_tag, body_start)
        next_open = text.find(open_tag, body_start)
        closed = close != -1 and (next_open == -1 or close < next_open)
        if closed:
            body, pos = text[body_start:close], close + len(close_tag)
        else:
            end = next_open if next_open != -1 else len(text)
            body, pos = text[body_start:end], end
        blocks.append((body, closed))
    outside.append(text[pos:])
    return blocks, "".join(outside).strip()


_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


def _parse_json_block(body: str, strict: bool) -> dict[str, Any] | ToolParseError:
    """The JSON object of one block. `strict`: the block was closed, so nothing else may be inside."""
    stripped = body.strip()
    fenced = _FENCE.match(stripped)
    if fenced is not None:
        stripped = fenced.group(1).strip()
    if not stripped:
        return ToolParseError("empty <tool_call> block", body, "empty")
    try:
        obj, end = json.JSONDecoder().raw_decode(stripped)
    except (ValueError, RecursionError) as exc:
        return ToolParseError(f"invalid JSON in <tool_call>: {_short(exc)}", body, "invalid_json")
    if strict and stripped[end:].strip():
        return ToolParseError("unexpected text after the JSON object in <tool_call>", body, "trailing_text")
    if not isinstance(obj, dict):
        return ToolParseError(f"<tool_call> must hold a JSON object, got {type(obj).__name__}", body, "not_an_object")
    return obj


_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")


def _call_from_object(obj: dict[str, Any], raw: str) -> ToolCall | ToolParseError:
    """{"name", "arguments"|"parameters"|...} or the OpenAI {"function": {...}} shape -> ToolCall."""
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolParseError('a tool call needs a non-empty string "name"', raw, "missing_name")
    arguments = next((obj[key] for key in _ARGUMENT_KEYS if key in obj), {})
    for _ in range(2):  # double- (rarely triple-) encoded arguments: '"arguments": "{\"x\": 1}"'
        if not isinstance(arguments, str):
            break
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            return ToolParseError(f'invalid JSON in the "arguments" string: {_short(exc)}', raw, "bad_arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolParseError(
            f'"arguments" must be a JSON object, got {type(arguments).__name__}', raw, "bad_arguments"
        )
    return ToolCall(name=name.strip(), arguments=arguments)


# ---------------------------------------------------------------- qwen3-coder XML

_FUNCTION = re.compile(r"<function=([^>\n]*)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>")


def parse_qwen3_coder_tool_calls(text: str, tools: ToolSchemas | None = None) -> ParsedToolCalls:
    """Parse Qwen3-Coder XML calls; a `<function=...>` without the `<tool_call>` wrapper is accepted too."""
    if not isinstance(text, str):
        return _bad_input(text)
    blocks, content = _scan_blocks(text)
    if not blocks and "<function=" in text:
        blocks, content = _scan_blocks(text, "<function=", "</function>")
        blocks = [("<function=" + body + "</function>", closed) for body, closed in blocks]
    items = [_repaired(result, tools) for body, _closed in blocks for result in _parse_xml_block(body, tools)]
    return ParsedToolCalls.of(items, content)


def _parse_xml_block(body: str, tools: ToolSchemas | None) -> list[ToolCall | ToolParseError]:
    functions = list(_FUNCTION.finditer(body))
    if not functions:
        kind: ParseErrorKind = "empty" if not body.strip() else "missing_name"
        return [ToolParseError("<tool_call> needs a <function=NAME> element", body, kind)]
    results: list[ToolCall | ToolParseError] = []
    for i, match in enumerate(functions):
        end = functions[i + 1].start() if i + 1 < len(functions) else len(body)
        inner = body[match.end() : end]
        inner = inner[: inner.find("</function>")] if "</function>" in inner else inner
        name = match.group(1).strip()
        if not name:
            results.append(ToolParseError("<function=NAME> needs a non-empty NAME", body, "missing_name"))
            continue
        properties = _properties(name, tools)
        arguments: dict[str, Any] = {}
        params = list(_PARAMETER.finditer(inner))
        for j, param in enumerate(params):
            stop = params[j + 1].start() if j + 1 < len(params) else len(inner)
            value = inner[param.end() : stop]
            value = value[: value.find("</parameter>")] if "</parameter>" in value else value
            value = value.removeprefix("\n").removesuffix("\n")
            key = param.group(1).strip()
            arguments[key] = coerce_value(value, properties.get(key))
        results.append(ToolCall(name=name, arguments=arguments))
    return results


def coerce_value(text: str, schema: dict[str, Any] | None) -> Any:
    """Text of one XML parameter -> the JSON type its schema asks for; text that does not fit stays text."""
    if not isinstance(schema, dict):
        return text
    types = schema.get("type")
    candidates = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else []
    for option in schema.get("anyOf", []) or []:
        if isinstance(option, dict) and isinstance(option.get("type"), str):
            candidates.append(option["type"])
    if not candidates or "string" in candidates:
        return text
    stripped = text.strip()
    for kind in candidates:
        try:
            if kind == "integer":
                return int(stripped)
            if kind == "number":
                number = float(stripped)
                return int(number) if number.is_integer() and "." not in stripped and "e" not in stripped else number
            if kind == "boolean" and stripped.lower() in ("true", "false"):
                return stripped.lower() == "true"
            if kind == "null" and stripped.lower() in ("null", "none", ""):
                return None
            if kind in ("object", "array"):
                value = json.loads(stripped)
                if isinstance(value, dict if kind == "object" else list):
                    return value
        except (ValueError, RecursionError, OverflowError):
            continue
    return text


# ---------------------------------------------------------------- llama-3 JSON


def parse_llama3_tool_calls(text: str, tools: ToolSchemas | None = None) -> ParsedToolCalls:
    """Llama 3.1 JSON calls: the text (after an optional `<|python_tag|>`) is one or more JSON objects."""
    if not isinstance(text, str):
        return _bad_input(text)
    tagged = PYTHON_TAG in text
    before, _, body = text.partition(PYTHON_TAG) if tagged else ("", "", text)
    for end_token in ("<|eom_id|>", "<|eot_id|>"):
        body = body.replace(end_token, "")
    if not tagged and not body.lstrip().startswith("{"):
        return ParsedToolCalls(content=text.strip())
    items: list[ToolCall | ToolParseError] = []
    decoder = json.JSONDecoder()
    pos, rest = 0, body.strip()
    while pos < len(rest):
        try:
            obj, end = decoder.raw_decode(rest, pos)
        except (ValueError, RecursionError) as exc:
            items.append(ToolParseError(f"invalid JSON tool call: {_short(exc)}", rest[pos:], "invalid_json"))
            break
        result: ToolCall | ToolParseError = (
            _call_from_object(obj, rest[pos:end])
            if isinstance(obj, dict)
            else ToolParseError(f"a tool call must be a JSON object, got {type(obj).__name__}", rest, "not_an_object")
        )
        items.append(_repaired(result, tools))
        pos = end
        while pos < len(rest) and rest[pos] in " \t\r\n;,":
            pos += 1
    if not items and tagged:
        items.append(ToolParseError(f"empty tool call after {PYTHON_TAG}", body, "empty"))
    return ParsedToolCalls.of(items, before.strip())


# ---------------------------------------------------------------- shared: schema-aware argument repair

ARGUMENT_ALIASES: dict[str, tuple[str, ...]] = {
    "code": ("python_code", "source_code", "source", "program", "script", "python"),
    "query": ("sql", "sql_query", "search_query", "q", "question"),
    "expression": ("expr", "formula", "equation", "math"),
    "path": ("file_path", "filepath", "filename", "file"),
    "url": ("link", "uri"),
    "timezone": ("tz", "time_zone"),
}
"""schema property -> names models use for it. A key is renamed only when the tool's schema has the
property, lacks the alias, and the arguments do not already set the property."""


def repair_arguments(name: str, arguments: dict[str, Any], tools: ToolSchemas | None) -> dict[str, Any]:
    """Rename aliased argument keys to the tool schema's names (`python_code` -> `code`). No schema: unchanged."""
    properties = _properties(name, tools)
    if not properties:
        return arguments
    repaired = dict(arguments)
    for key in list(repaired):
        if key in properties:
            continue
        target = _alias_target(key, properties)
        if target is not None and target not in repaired:
            repaired[target] = repaired.pop(key)
    return repaired


def _alias_target(key: str, properties: dict[str, Any]) -> str | None:
    lowered = key.lower()
    for prop, aliases in ARGUMENT_ALIASES.items():
        if prop in properties and lowered in aliases:
            return prop
    # `python_code` / `code_str` for a schema with exactly one matching property.
    matches = [p for p in properties if lowered.endswith("_" + p) or lowered.startswith(p + "_") or lowered == p]
    return matches[0] if len(matches) == 1 else None


def _properties(name: str, tools: ToolSchemas | None) -> dict[str, Any]:
    for spec in tools or ():
        function = spec.get("function", spec) if isinstance(spec, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def _repaired(result: ToolCall | ToolParseError, tools: ToolSchemas | None) -> ToolCall | ToolParseError:
    if isinstance(result, ToolParseError):
        return result
    return ToolCall(result.name, repair_arguments(result.name, result.arguments, tools))


def _bad_input(text: object) -> ParsedToolCalls:
    error = ToolParseError(f"expected text, got {type(text).__name__}", repr(text)[:200], "bad_input")
    return ParsedToolCalls.of([error])


def _short(exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    return message if len(message) <= 120 else message[:117] + "..."


# ---------------------------------------------------------------- the table

TOOL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": parse_hermes_tool_calls,
    "qwen3_coder": parse_qwen3_coder_tool_calls,
    "llama3": parse_llama3_tool_calls,
}
"""Parser name (EnvConfig.tool_parser) -> parser."""

TOOL_CALL_FORMATTERS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "hermes": format_hermes_tool_call,
    "qwen3_coder": format_qwen3_coder_tool_call,
    "llama3": format_llama3_tool_call,
}


def get_parser(name: str) -> ToolCallParser:
    """The parser called `name`; an unknown name is an error listing the valid ones."""
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        raise ValueError(f"unknown tool parser {name!r}; valid names: {', '.join(sorted(TOOL_PARSERS))}")
    return parser

"""Chat messages + tools -> prompt token ids through the model's own chat template."""

from __future__ import annotations

import json
import warnings
from typing import Any

from thermik.inference.server.errors import ApiError
from thermik.inference.server.protocol import ChatCompletionRequest, ChatMessage
from thermik.models.chat_template import (
    FALLBACK_CALL_INSTRUCTIONS,
    ToolsIgnoredWarning,
    template_renders_tools,
    tools_system_text,
    with_system_text,
)
from thermik.tools.parsers import format_hermes_tool_call

_RENDERS_TOOLS: dict[str, bool] = {}
"""Probe result per chat template text (the server reads tool calls with the hermes parser)."""


def _content(message: ChatMessage) -> str | None:
    if isinstance(message.content, list):
        return "".join(part.text for part in message.content)
    return message.content


def call_arguments(arguments: str, param: str) -> dict[str, Any]:
    """A call's JSON arguments as the dict chat templates want (a JSON string renders twice); a 400 naming `param`
    when they are not a JSON object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ApiError(400, f"tool call arguments are not valid JSON: {exc}", param) from exc
    if not isinstance(value, dict):
        raise ApiError(400, "tool call arguments must be a JSON object", param)
    return value


def template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """One message as chat templates expect it: developer as system, tool-call arguments as a dict."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _content(message)}
    if message.tool_calls:
        where = f"messages.{index}.tool_calls"
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name,
                "arguments": call_arguments(call.function.arguments, f"{where}.{j}.function.arguments"),
            }}
            for j, call in enumerate(message.tool_calls)
        ]  # fmt: skip
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def render_chat(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """Prompt ids of a chat request, ending with the generation prompt."""
    messages = [template_message(m, i) for i, m in enumerate(body.messages)]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    if tools and not _renders_tools(tokenizer):  # never drop tools silently: put them in the system message
        example = format_hermes_tool_call("function_name", {"argument_name": "value"})
        messages = with_system_text(messages, tools_system_text(tools, FALLBACK_CALL_INSTRUCTIONS["hermes"], example))
        tools = None
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template refusing these messages (raise_exception, bad types) is a 400
        raise ApiError(400, f"the chat template cannot render these messages: {exc}", "messages") from exc
    return list(tokenizer.encode(text, add_special_tokens=False))


def _renders_tools(tokenizer: Any) -> bool:
    template = str(tokenizer.chat_template)
    if template not in _RENDERS_TOOLS:
        _RENDERS_TOOLS[template] = template_renders_tools(
            lambda m, t: tokenizer.apply_chat_template(m, tools=t, tokenize=False)
        )
        if not _RENDERS_TOOLS[template]:
            warnings.warn(
                "the model's chat template ignores `tools`: requests with tools get the tool schemas in the system "
                "message, calls in the hermes <tool_call> format",
                ToolsIgnoredWarning,
                stacklevel=3,
            )
    return _RENDERS_TOOLS[template]

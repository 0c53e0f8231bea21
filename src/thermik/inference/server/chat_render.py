"""A chat-completions request -> prompt token ids: the request's messages as chat templates expect them, rendered
by thermik.models.chat (tools in the template, or in the system message where the template ignores them)."""

from __future__ import annotations

import json
from typing import Any

from thermik.inference.server.errors import ApiError
from thermik.inference.server.protocol import ChatCompletionRequest, ChatMessage
from thermik.models.chat import render_with_tools


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
    """Prompt ids of a chat request, ending with the generation prompt (the server reads tool calls with the hermes
    parser, so a template that ignores tools gets hermes calls in the system message)."""
    messages = [template_message(m, i) for i, m in enumerate(body.messages)]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    try:
        text = render_with_tools(tokenizer, messages, tools)
    except Exception as exc:  # a template refusing these messages (raise_exception, bad types) is a 400
        raise ApiError(400, f"the chat template cannot render these messages: {exc}", "messages") from exc
    return list(tokenizer.encode(text, add_special_tokens=False))

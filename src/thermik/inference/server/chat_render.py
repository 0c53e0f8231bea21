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


def _template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """One message as chat templates expect it: tool-call arguments as a dict (a JSON string renders twice)."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _content(message)}
    if message.tool_calls:
        calls = []
        for j, call in enumerate(message.tool_calls):
            try:
                arguments = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
            except ValueError as exc:
                raise ApiError(
                    400, f"tool call arguments are not valid JSON: {exc}",
                    f"messages.{index}.tool_calls.{j}.function.arguments",
                ) from exc  # fmt: skip
            if not isinstance(arguments, dict):
                raise ApiError(400, "tool call arguments must be a JSON object",
                               f"messages.{index}.tool_calls.{j}.function.arguments")  # fmt: skip
            calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                                          "arguments": arguments}})  # fmt: skip
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def render_chat(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """Prompt ids of a chat request, ending with the generation prompt (the server reads tool calls with the hermes
    parser, so a template that ignores tools gets hermes calls in the system message)."""
    messages = [_template_message(m, i) for i, m in enumerate(body.messages)]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    try:
        text = render_with_tools(tokenizer, messages, tools)
    except Exception as exc:  # a template refusing these messages (raise_exception, bad types) is a 400
        raise ApiError(400, f"the chat template cannot render these messages: {exc}", "messages") from exc
    return list(tokenizer.encode(text, add_special_tokens=False))

"""Requests' conversations as chat-template messages, and the key that says whether one conversation extends another.

Chat requests and Responses requests both become a list of template messages (`role`, `content` text, assistant
`tool_calls` with their arguments as a dict, a tool result's `tool_call_id`). `message_key` is what a message means
for the prompt, not how the harness spelled it: call ids, whitespace around content and an absent-vs-empty content
do not count, so a harness that replays the reply it got back in its own way still extends the episode.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]


def message_key(message: Message) -> tuple[Any, ...]:
    """What `message` contributes to a prompt: role, content text and the calls' names and arguments."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or ()
    )
    return message["role"], (message.get("content") or "").strip(), calls


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


def assistant_message(content: str | None, calls: list[dict[str, Any]]) -> Message:
    """The template message of a reply: `calls` are OpenAI tool_calls (arguments as JSON text)."""
    message: Message = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in calls
        ]  # fmt: skip
    return message

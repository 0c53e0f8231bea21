"""Dependent-spec conversations -> compact rows for the `mcp` environment (MCPToolEnv).

A dependent-spec conversation is a multi-turn tool-use transcript in which later user turns depend on
earlier tool results ("now book the cheapest of those flights"). Training on it turn by turn would
leak the tool results into the prompt, so the row keeps the system message and the first user message
only, and moves what the assistant did into `reward_spec.ground_truth`:

- `tool_sequence`: every tool call in order, as {"tool": name, "parameters": {...}};
- `must_call_tool`: true;
- `answer`: the text of the last `<answer>...</answer>`, when the transcript has one.

Tool calls are read from OpenAI-style `tool_calls` fields or from Hermes `<tool_call>` blocks in the text.
Input: a jsonl file, one conversation per line, as {"messages": [...], "tools": [...]?} or a bare list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thermik.data.dataset import DatasetError, read_jsonl
from thermik.envs.answers import tagged_answer
from thermik.tools.parsers import parse_hermes_tool_calls

DEFAULT_ENV_CLASS = "mcp"


def tool_calls_of(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The calls of one assistant message as {"tool", "parameters"}; a malformed call is a DatasetError."""
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function", call) if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", {}) if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise DatasetError(f"{where}: tool_calls[{i}].arguments is not valid JSON: {exc}") from None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise DatasetError(f"{where}: tool_calls[{i}] needs a string name and object arguments")
        calls.append({"tool": name, "parameters": arguments})
    content = message.get("content")
    if isinstance(content, str):
        parsed = parse_hermes_tool_calls(content)
        if parsed.errors:
            raise DatasetError(f"{where}: unreadable <tool_call> block: {parsed.errors[0].message}")
        calls += [{"tool": c.name, "parameters": c.arguments} for c in parsed.calls]
    return calls


def compact_row(conversation: Any, where: str, env_class: str = DEFAULT_ENV_CLASS) -> dict[str, Any]:
    """One conversation -> one row; names the problem and its place (`where`) when the input is malformed."""
    record = conversation if isinstance(conversation, dict) else {"messages": conversation}
    messages = record.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise DatasetError(f"{where}: expected {{'messages': [...]}} or a list of message objects")
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is None:
        raise DatasetError(f"{where}: the conversation has no user message")
    prompt = [m for m in messages[:first_user] if m.get("role") == "system"] + [messages[first_user]]
    prompt = [{"role": m["role"], "content": str(m.get("content") or "")} for m in prompt]
    sequence: list[dict[str, Any]] = []
    answer = None
    for i, message in enumerate(messages[first_user + 1 :], start=first_user + 1):
        if message.get("role") == "assistant":
            sequence += tool_calls_of(message, f"{where} message {i}")
            answer = tagged_answer(str(message.get("content") or "")) or answer
    if not sequence:
        raise DatasetError(f"{where}: the conversation has no tool call; nothing to grade")
    truth: dict[str, Any] = {"must_call_tool": True, "tool_sequence": sequence}
    if answer is not None:
        truth["answer"] = answer.strip()
    extra = {"tools": record["tools"]} if isinstance(record.get("tools"), list) else {}
    return {
        "data_source": "converted/dependent_spec",
        "env_class": env_class,
        "prompt": prompt,
        "reward_spec": {"method": "rule", "ground_truth": truth},
        "extra_info": {**extra, "num_user_turns": sum(m.get("role") == "user" for m in messages)},
    }


def convert_conversations(path: str | Path, env_class: str = DEFAULT_ENV_CLASS) -> list[dict[str, Any]]:
    """Every conversation of a jsonl file as a compact row (1-based line numbers in errors)."""
    return [compact_row(c, f"{path} conversation {i}", env_class) for i, c in enumerate(read_jsonl(path), start=1)]

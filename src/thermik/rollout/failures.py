"""Why an episode failed: one category per unsolved trajectory, read from its conversation and stop reason.

The categories (docs/evaluation.md), in the order they are tested, the first match wins:

- `agent_failed`: an agent harness (`[agent]`) failed the episode: it crashed, hung, went over budget (docs/agents.md);
- `malformed_tool_call`: an assistant turn holds a tool-call block the parser cannot read;
- `unknown_tool_or_bad_arguments`: a tool result says the tool does not exist or its arguments were refused;
- `tool_error`: any other tool result that reports an error (`error: ...`);
- `context_overflow`: the episode ran out of room (stop reason `length`: sequence or generation limit);
- `turn_limit`: the episode used all of `env.max_turns` (stop reason `max_turns`);
- `no_final_answer`: the last assistant turn holds no text outside tool calls;
- `wrong_answer`: the episode ended with an answer that earned less than full reward.

A solved episode (reward >= SUCCESS_THRESHOLD) has no category, even if it recovered from a tool error.
"""

from __future__ import annotations

import re
from typing import Any

from thermik.tools.parsers import get_parser

SUCCESS_THRESHOLD = 1.0 - 1e-6
"""An episode succeeds when its total reward reaches 1 (exact answer, exact reversal)."""

FAILURE_CATEGORIES = (
    "agent_failed",
    "malformed_tool_call",
    "unknown_tool_or_bad_arguments",
    "tool_error",
    "context_overflow",
    "turn_limit",
    "no_final_answer",
    "wrong_answer",
)

_REFUSED_CALL = re.compile(
    r"unknown tool|not found|no such tool|bad arguments|invalid arguments|validation error|missing required", re.I
)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def _tool_result_category(messages: list[dict[str, Any]]) -> str | None:
    for m in messages:
        text = str(m.get("content") or "")
        if m.get("role") == "tool" and text.lstrip().lower().startswith("error"):
            return "unknown_tool_or_bad_arguments" if _REFUSED_CALL.search(text) else "tool_error"
    return None


def classify(
    messages: list[dict[str, Any]], stop_reason: str, reward: float, n_prompt: int, tool_parser: str = "hermes"
) -> str | None:
    """The failure category of one episode (None when solved). `messages[n_prompt:]` are the episode's turns."""
    if reward >= SUCCESS_THRESHOLD:
        return None
    turns = messages[n_prompt:]
    parse = get_parser(tool_parser)
    assistant = [str(m.get("content") or "") for m in turns if m.get("role") == "assistant"]
    if any(parse(text, None).errors for text in assistant):
        return "malformed_tool_call"
    tool_category = _tool_result_category(turns)
    if tool_category is not None:
        return tool_category
    if stop_reason == "length":
        return "context_overflow"
    if stop_reason == "max_turns":
        return "turn_limit"
    last = parse(assistant[-1] if assistant else "", None)
    if last.calls or not _THINK.sub("", last.content).strip():
        return "no_final_answer"
    return "wrong_answer"

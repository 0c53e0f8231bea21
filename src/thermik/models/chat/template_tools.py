"""Tools in chat templates: whether a template shows the model its tools, and the system-message fallback when not.

Tools are never dropped silently. A template that ignores `tools` (plain ChatML, e.g. SmolLM2's) is detected by
rendering a probe conversation with and without a tool; its prompts then carry the tool schemas in the system
message, with the call format the configured tool parser reads (docs/models.md).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

PROBE_TOOL_NAME = "thermik_probe_tool"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "Probe whether the chat template renders tools.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}
_PROBE_MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

# How the fallback asks for a call, per tool parser (EnvConfig.tool_parser), and an example call as the parser's own
# formatter writes it (thermik.tools.parsers.TOOL_CALL_FORMATTERS; tests/test_chat_templates.py holds them equal),
# so the prompt shows the text the parser reads.
FALLBACK_CALL_INSTRUCTIONS: dict[str, str] = {
    "hermes": "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    "qwen3_coder": "To call a function, reply in the following format:",
    "llama3": "To call a function, respond with a JSON object of the function name and its parameters:",
}
FALLBACK_CALL_EXAMPLES: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "function_name", "arguments": {"argument_name": "value"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=function_name>\n<parameter=argument_name>\nvalue\n</parameter>\n"
    "</function>\n</tool_call>",
    "llama3": '{"name": "function_name", "parameters": {"argument_name": "value"}}',
}


class ToolsIgnoredWarning(UserWarning):
    """The chat template ignores `tools`; thermik renders the tool schemas into the system message instead."""


Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], str]


def template_renders_tools(render: Render) -> bool:
    """Whether a template shows the model its tools: a probe conversation rendered with one tool must differ from
    the same conversation without it and name the tool. A template that raises on `tools` counts as ignoring them."""
    without = render(_PROBE_MESSAGES, None)
    try:
        with_tool = render(_PROBE_MESSAGES, [_PROBE_TOOL])
    except Exception:  # jinja raises TemplateError; a template's raise_exception() anything
        return False
    return with_tool != without and PROBE_TOOL_NAME in with_tool


def tool_name(tool: dict[str, Any]) -> str:
    """Name of an OpenAI function spec ({"type": "function", "function": {...}}) or a bare function dict."""
    return str(tool.get("function", tool).get("name", ""))


def tools_system_text(tools: list[dict[str, Any]], call_instruction: str, call_example: str) -> str:
    """The tool block the fallback puts in the system message: one JSON schema per line between `<tools>` tags
    (Qwen2.5's layout), then how to call one, with an example written by the configured parser's formatter."""
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
        f"{call_instruction}\n{call_example}"
    )


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` appended to the first system message (after a blank line), or a new one first."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first.get("content")
        if isinstance(content, str) or content is None:
            first["content"] = f"{content}\n\n{text}" if content else text
        else:
            first["content"] = [*content, {"type": "text", "text": f"\n\n{text}"}]
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def fallback_tools_text(tools: list[dict[str, Any]], tool_format: str) -> str:
    """The system-message tool block for a template that ignores tools, calls written as `tool_format` reads them."""
    return tools_system_text(tools, FALLBACK_CALL_INSTRUCTIONS[tool_format], FALLBACK_CALL_EXAMPLES[tool_format])


_RENDERS_TOOLS: dict[str, bool] = {}
"""Probe result per chat template text, for `render_with_tools`."""


def render_with_tools(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The prompt text of an OpenAI-style request (thermik's server), ending with the generation prompt. A template
    that ignores tools gets them in the system message, calls in the hermes format (warned once per template)."""
    if tools and not _template_renders_tools_cached(tokenizer):
        messages = with_system_text(messages, fallback_tools_text(tools, "hermes"))
        tools = None
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def _template_renders_tools_cached(tokenizer: Any) -> bool:
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
                stacklevel=4,
            )
    return _RENDERS_TOOLS[template]

"""The one chat renderer: chat templates, tools in templates, prompts and observation deltas as token ids, and the
conversation's prefix check. The data (SFT conversations), rollout (agent loop) and server (chat completions) code
all render through it.

- templates.py: the chat templates a preset ships (`CHAT_TEMPLATES`).
- template_tools.py: whether a template renders tools, the system-message fallback when it does not, and the server's
  rendering of an OpenAI-style request (`render_with_tools`).
- renderer.py: `ChatTokenizer`, token ids of prompts, observation deltas and whole conversations; nothing sampled is
  ever re-tokenized.
- history.py: `PromptHistory`, the conversation as the policy sees it and whether its next rendering extends the
  tokens so far (step-wise trajectories).
"""

from thermik.models.chat.history import NextPrompt, PromptHistory
from thermik.models.chat.renderer import ChatTokenizer, Message, MissingChatTemplateError
from thermik.models.chat.template_tools import (
    FALLBACK_CALL_EXAMPLES,
    FALLBACK_CALL_INSTRUCTIONS,
    ToolsIgnoredWarning,
    fallback_tools_text,
    render_with_tools,
    template_renders_tools,
    tool_name,
    tools_system_text,
    with_system_text,
)
from thermik.models.chat.templates import CHAT_TEMPLATES, CHATML_TOOL_TEMPLATE, QWEN3_THINKING_TEMPLATE

__all__ = [
    "CHATML_TOOL_TEMPLATE",
    "CHAT_TEMPLATES",
    "FALLBACK_CALL_EXAMPLES",
    "FALLBACK_CALL_INSTRUCTIONS",
    "QWEN3_THINKING_TEMPLATE",
    "ChatTokenizer",
    "Message",
    "MissingChatTemplateError",
    "NextPrompt",
    "PromptHistory",
    "ToolsIgnoredWarning",
    "fallback_tools_text",
    "render_with_tools",
    "template_renders_tools",
    "tool_name",
    "tools_system_text",
    "with_system_text",
]

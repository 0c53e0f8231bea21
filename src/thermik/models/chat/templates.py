"""ChatML chat template with Hermes/Qwen2.5-style tool calls, kept short for tiny models.

Rendered shape (every message is ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``)::

    <|im_start|>system
    SYSTEM CONTENT

    # Tools
    ...<tools>
    {"name": ..., "description": ..., "parameters": ...}
    </tools>
    ...<|im_end|>
    <|im_start|>user
    What is 2+3?<|im_end|>
    <|im_start|>assistant
    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>5</tool_response><|im_end|>

Unlike Qwen's template, a tool result sits directly between its tags (no newlines): a tiny character-level
model then finds the first character of the result as "the token after <tool_response>" in one attention
hop, and learned to copy results into its answer within the SFT budget (it had not after 700 steps with the
newlines). Real models bring their own template in their model directory.

Prefix consistency: for k >= 1, ``render(msgs[:k])`` is a prefix of ``render(msgs)`` unless ``msgs[k]`` continues
a run of ``tool`` messages (consecutive tool results share one user turn, so its closing ``<|im_end|>`` moves).
Nothing is dropped from earlier turns (``<think>`` content is kept), so accumulated token ids match re-rendering.
Assistant content up to and including ``<|im_end|>`` (what the model samples) is wrapped in ``{% generation %}``,
so ``return_assistant_tokens_mask=True`` marks exactly those tokens; the newline after it is template text.
"""

from __future__ import annotations

# Kept short on purpose: tiny character-level models pay for every prompt character in every step.
TOOLS_INSTRUCTION_HEAD = "# Tools\n<tools>\n"
TOOLS_INSTRUCTION_TAIL = '</tools>\nCall a tool as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'


# Whitespace is controlled explicitly with `{%-`/`-%}`; transformers renders with trim_blocks and lstrip_blocks.
_CONTENT_MACRO = (
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}{%- elif content is string -%}{{- content -}}"
    "{%- elif content is sequence and content is not mapping -%}"
    "{%- for part in content -%}{%- if part is string -%}{{- part -}}"
    "{%- elif part.type == 'text' -%}{{- part.text -}}"
    "{%- else -%}{{- raise_exception('only text content parts are supported, got ' + part.type) -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{- content | tojson -}}{%- endif -%}"
    "{%- endmacro -%}"
)
# System turn: the given system message and/or the tool block.
_SYSTEM_TURN = (
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}"
    "{%- if tools or has_system -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- render_content(messages[0].content) -}}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if has_system -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{{- " + repr(TOOLS_INSTRUCTION_HEAD) + " -}}"
    "{%- for tool in tools -%}"
    "{%- if tool.function is defined -%}{{- tool.function | tojson -}}{%- else -%}{{- tool | tojson -}}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- " + repr(TOOLS_INSTRUCTION_TAIL) + " -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
)
_USER_TURN = (
    "{%- elif message.role == 'user' or message.role == 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}{{- render_content(message.content) -}}{{- '<|im_end|>\\n' -}}"
)
_TOOL_CALLS = (
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' -}}{{- call.name | tojson -}}{{- ', \"arguments\": ' -}}"
    "{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
)
_ASSISTANT_TURN = (
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{{- render_content(message.content) -}}" + _TOOL_CALLS + "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
)
_TOOL_TURN_AND_END = (
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user\\n' -}}{%- else -%}{{- '\\n' -}}"
    "{%- endif -%}"
    "{{- '<tool_response>' -}}{{- render_content(message.content) -}}{{- '</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- raise_exception('unknown message role ' + message.role + '; expected system, user, assistant or tool') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
_MESSAGES_HEAD = "{%- for message in messages -%}{%- if loop.first and has_system -%}"

CHATML_TOOL_TEMPLATE = (
    _CONTENT_MACRO
    + _SYSTEM_TURN
    + _MESSAGES_HEAD
    + _USER_TURN
    + _ASSISTANT_TURN
    + _TOOL_TURN_AND_END
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen3's thinking rules on the template above (docs/models.md, 'Thinking models'). The last query is the last user
# message that is not a tool result; an assistant turn after it keeps its thinking (`reasoning_content`, or the
# text before `</think>` in its content) when it has some or is the last message, as
# "<think>\nREASONING\n</think>\n\nANSWER"; every earlier assistant turn shows its answer only. With
# `enable_thinking=false` the generation prompt closes an empty thinking block.
_LAST_QUERY = (
    "{%- set ns = namespace(last_query_index=messages | length - 1, searching=true) -%}"
    "{%- for message in messages[::-1] -%}"
    "{%- set index = messages | length - 1 - loop.index0 -%}"
    "{%- if ns.searching and message.role == 'user' and message.content is string and not "
    "(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) -%}"
    "{%- set ns.searching = false -%}{%- set ns.last_query_index = index -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
_THINKING_ASSISTANT_TURN = (
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = render_content(message.content) -%}"
    "{%- set reasoning = '' -%}"
    "{%- if message.reasoning_content is string -%}{%- set reasoning = message.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}{{- content -}}{%- endif -%}" + _TOOL_CALLS + "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
)

QWEN3_THINKING_TEMPLATE = (
    _CONTENT_MACRO
    + _SYSTEM_TURN
    + _LAST_QUERY
    + _MESSAGES_HEAD
    + _USER_TURN
    + _THINKING_ASSISTANT_TURN
    + _TOOL_TURN_AND_END
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

CHAT_TEMPLATES: dict[str, str] = {"chatml-tools": CHATML_TOOL_TEMPLATE, "qwen3-thinking": QWEN3_THINKING_TEMPLATE}
"""The templates a preset can ship (`Preset.template`)."""

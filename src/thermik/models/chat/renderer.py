"""Chat-template tokenization for the agent loop, built so that nothing sampled is ever re-tokenized.

The prompt is rendered once. Each observation (tool result, feedback) is rendered as the *delta*
the chat template adds after an assistant turn, so the training sequence is exactly
prompt ids + sampled ids + observation ids (docs/architecture.md, invariant 1).

Tools are never dropped silently. A template that ignores `tools` (plain ChatML, e.g. SmolLM2's) is detected once
by rendering a probe conversation with and without a tool; its prompts then carry the tool schemas in the system
message, with the call format the configured tool parser reads, and a one-time `ToolsIgnoredWarning` says so
(docs/models.md). `model.chat_template` replaces the template instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from thermik.errors import ThermikError
from thermik.models.chat.template_tools import (
    FALLBACK_CALL_INSTRUCTIONS,
    ToolsIgnoredWarning,
    fallback_tools_text,
    template_renders_tools,
    tool_name,
    with_system_text,
)

Message = dict[str, Any]  # a chat message, as thermik.envs.base.Message

# A fixed conversation the observation deltas are rendered after; its content never reaches the model.
_BASE: list[Message] = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class MissingChatTemplateError(ThermikError, ValueError):
    """A model without a chat template: every command says so in one line, as `thermik model import` does."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"{model} has no chat template (thermik renders prompts and tool turns with it); pass one with "
            "--model.chat_template FILE.jinja"
        )


class ChatTokenizer:
    """Wraps an HF tokenizer with a chat template; every method returns token ids, never text to re-tokenize."""

    def __init__(self, tokenizer: Any, tool_format: str = "hermes", enable_thinking: bool | None = None) -> None:
        self.tokenizer = tokenizer
        # model.enable_thinking, passed to the template (Qwen3-style templates read it); None passes nothing.
        self._template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if tool_format not in FALLBACK_CALL_INSTRUCTIONS:
            raise ValueError(f"unknown tool format {tool_format!r}; valid: {', '.join(FALLBACK_CALL_INSTRUCTIONS)}")
        self.tool_format = tool_format
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token; set eos_token to the end-of-turn token (e.g. <|im_end|>)")
        if not getattr(tokenizer, "chat_template", None):
            raise MissingChatTemplateError(getattr(tokenizer, "name_or_path", "") or "the tokenizer")
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.stop_ids: tuple[int, ...] = tuple(
            sorted({self.eos_id} | ({int(tokenizer.pad_token_id)} if tokenizer.pad_token_id is not None else set()))
        )
        base = self._render(_BASE, add_generation_prompt=False)
        eos_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        cut = base.rfind(eos_text)
        if cut < 0:
            raise ValueError(f"the chat template does not close assistant turns with the eos token {eos_text!r}")
        self._eos_text = eos_text
        # What the template writes after the eos of an assistant turn (ChatML: "\n"); the engine stops at eos,
        # so these characters belong to the next observation.
        self.after_eos = base[cut + len(eos_text) :]
        # Observation deltas are read after the base assistant turn's eos (the n-th eos of a rendering). Only the
        # turns before it must render unchanged: a template may re-render the assistant turn itself (Qwen3 adds an
        # empty <think> block to a last assistant turn only); the loop keeps the sampled ids either way.
        self._head = self._render(_BASE[:1], add_generation_prompt=False)
        self._base_eos_count = base.count(eos_text)
        self.renders_tools: bool = template_renders_tools(lambda m, t: self._render(m, False, t))
        self._warned = False

    def _render(self, messages: list[Message], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **self._template_kwargs
        )

    def render(
        self, messages: list[Message], tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the model sees: the template's own tool rendering, or the system-message fallback."""
        if tools and not self.renders_tools:
            self._warn_fallback()
            return self._render(
                with_system_text(messages, fallback_tools_text(tools, self.tool_format)), add_generation_prompt
            )
        text = self._render(messages, add_generation_prompt, tools)
        missing = [tool_name(t) for t in tools or () if tool_name(t) not in text]
        if missing:
            raise ValueError(f"the chat template dropped the tools {', '.join(missing)}; set model.chat_template")
        return text

    def _warn_fallback(self) -> None:
        if self._warned:
            return
        self._warned = True
        name = getattr(self.tokenizer, "name_or_path", "") or "the model"
        warnings.warn(
            f"the chat template of {name} ignores `tools`: thermik writes the tool schemas into the system message, "
            f"with calls in the {self.tool_format!r} format (env.tool_parser). Set model.chat_template to a template "
            "that renders tools to change this.",
            ToolsIgnoredWarning,
            stacklevel=3,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of sampled ids for the environment, without the trailing stop token."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools))

    def encode_observations(self, observations: list[Message]) -> list[int]:
        """Ids the template inserts after an eos-terminated assistant turn, up to the next generation prompt."""
        return self.encode(self.observation_text(observations))

    def observation_text(self, observations: list[Message]) -> str:
        """The text of `encode_observations`."""
        full = self._render(_BASE + list(observations), add_generation_prompt=True)
        pos = -len(self._eos_text)
        for _ in range(self._base_eos_count):
            pos = full.find(self._eos_text, pos + len(self._eos_text))
            if pos < 0:
                break
        if pos < 0 or not full.startswith(self._head):
            raise ValueError("the chat template is not prefix-consistent: observations change earlier turns")
        return full[pos + len(self._eos_text) :]

    def encode_conversation(
        self, messages: list[Message], tools: list[dict] | None = None, roles: Collection[str] = ("assistant",)
    ) -> tuple[list[int], list[int]]:
        """(ids, loss_mask) of a solved conversation, built exactly as the agent loop builds a trajectory.

        Assistant contents are the raw text the model emits; each is followed by eos. The mask is 1 on the
        assistant tokens (content and eos) when "assistant" is in `roles`, and on the content tokens of every
        other message whose role is in `roles` (their template tokens stay 0).
        """
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            raise ValueError("conversation has no assistant message to learn from")
        ids, mask = self._encode_marked(self.render(messages[:first], tools), messages[:first], roles)
        pending: list[Message] = []
        for m in messages[first:]:
            if m["role"] != "assistant":
                pending.append(m)
                continue
            if pending:
                obs, obs_mask = self._encode_marked(self.observation_text(pending), pending, roles)
                ids += obs
                mask += obs_mask
                pending = []
            sampled = [*self.encode(m["content"]), self.eos_id]
            ids += sampled
            mask += [int("assistant" in roles)] * len(sampled)
        return ids, mask

    def _encode_marked(self, text: str, messages: list[Message], roles: Collection[str]) -> tuple[list[int], list[int]]:
        """(ids of `text`, 1 on the tokens inside the content of a message of `messages` whose role is in `roles`);
        each content is found in the rendered text after the previous one."""
        if not any(m["role"] in roles for m in messages):
            ids = self.encode(text)
            return ids, [0] * len(ids)
        spans, cursor = [], 0
        for m in messages:
            content = m.get("content") or ""
            at = text.find(content, cursor) if content else -1
            if at < 0:
                continue
            cursor = at + len(content)
            if m["role"] in roles:
                spans.append((at, cursor))
        enc = self.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        mask = [int(any(start < e and end > s for s, e in spans)) for start, end in enc["offset_mapping"]]
        return list(enc["input_ids"]), mask

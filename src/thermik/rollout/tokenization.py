"""Chat-template tokenization for the agent loop, built so that nothing sampled is ever re-tokenized.

The prompt is rendered once. Each observation (tool result, feedback) is rendered as the *delta*
the chat template adds after an assistant turn, so the training sequence is exactly
prompt ids + sampled ids + observation ids (DESIGN.md invariant 1).
"""

from __future__ import annotations

from typing import Any

from thermik.envs.base import Message

# A fixed conversation the observation deltas are rendered after; its content never reaches the model.
_BASE: list[Message] = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatTokenizer:
    """Wraps an HF tokenizer with a chat template; every method returns token ids, never text to re-tokenize."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token; set eos_token to the end-of-turn token (e.g. <|im_end|>)")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; thermik needs one to render prompts and tool turns")
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.stop_ids: tuple[int, ...] = tuple(
            sorted({self.eos_id} | ({int(tokenizer.pad_token_id)} if tokenizer.pad_token_id is not None else set()))
        )
        base = self._render(_BASE, add_generation_prompt=False)
        eos_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        cut = base.rfind(eos_text)
        if cut < 0:
            raise ValueError(f"the chat template does not close assistant turns with the eos token {eos_text!r}")
        self._base_text = base
        # What the template writes after the eos of an assistant turn (ChatML: "\n"); the engine stops at eos,
        # so these characters belong to the next observation.
        self._after_eos = base[cut + len(eos_text) :]

    def _render(self, messages: list[Message], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of sampled ids for the environment, without the trailing stop token."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self._render(messages, add_generation_prompt=True, tools=tools))

    def encode_observations(self, observations: list[Message]) -> list[int]:
        """Ids the template inserts after an eos-terminated assistant turn, up to the next generation prompt."""
        full = self._render(_BASE + list(observations), add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise ValueError("the chat template is not prefix-consistent: observations change earlier turns")
        return self.encode(self._after_eos + full[len(self._base_text) :])

    def encode_conversation(
        self, messages: list[Message], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """(ids, loss_mask) of a solved conversation, built exactly as the agent loop builds a trajectory.

        Assistant contents are the raw text the model emits; each is followed by eos (mask 1).
        """
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            raise ValueError("conversation has no assistant message to learn from")
        ids = self.encode_prompt(messages[:first], tools)
        mask = [0] * len(ids)
        pending: list[Message] = []
        for m in messages[first:]:
            if m["role"] != "assistant":
                pending.append(m)
                continue
            if pending:
                obs = self.encode_observations(pending)
                ids += obs
                mask += [0] * len(obs)
                pending = []
            sampled = [*self.encode(m["content"]), self.eos_id]
            ids += sampled
            mask += [1] * len(sampled)
        return ids, mask

"""The conversation the policy sees, rendered by the chat template, and the text its tokens spell so far.

Each next prompt is the template's rendering of the whole conversation. Where that rendering starts with the text
of the tokens so far (prompt, sampled turns, observations), only the new text is tokenized and appended: the
sampled ids are kept, never re-tokenized. Where it does not (a template that strips earlier thinking, a history
rewritten by a context policy), the prefix is broken and the rendering is tokenized whole, as a fresh prompt
(docs/algorithms.md, 'Step-wise trajectories').
"""

from __future__ import annotations

from dataclasses import dataclass

from thermik.models.chat.renderer import ChatTokenizer, Message


@dataclass(frozen=True)
class NextPrompt:
    """ids: the new tokens after the current ones when `extends`, else the whole fresh prompt; text: the rendering."""

    ids: list[int]
    extends: bool
    text: str


class PromptHistory:
    """Messages as the policy sees them (policies may rewrite them) and the text the current tokens spell."""

    def __init__(self, chat: ChatTokenizer, messages: list[Message], tools: list[dict] | None) -> None:
        self.chat, self.tools = chat, tools
        self.initial = list(messages)
        self.messages: list[Message] = list(messages)
        self._observations: list[int] = []  # indices in messages of environment observations
        self.text = chat.render(self.messages, tools)

    def prompt_ids(self) -> list[int]:
        """The first prompt, tokenized whole."""
        return self.chat.encode(self.text)

    def add_sampled(self, ids: list[int], text: str) -> None:
        """A sampled turn: `text` (its decoded content, stop token removed) joins the conversation; the tokens'
        own text (stop token included) extends what the current tokens spell."""
        self.messages.append({"role": "assistant", "content": text})
        self.text += self.chat.tokenizer.decode(ids, skip_special_tokens=False)

    def add_observations(self, observations: list[Message]) -> None:
        self._observations += range(len(self.messages), len(self.messages) + len(observations))
        self.messages += observations

    def add_user(self, content: str) -> None:
        self.messages.append({"role": "user", "content": content})

    def render_next(self) -> NextPrompt:
        """The next prompt for the conversation as it stands (not yet committed: see `commit`)."""
        text = self.chat.render(self.messages, self.tools)
        if text.startswith(self.text):
            return NextPrompt(self.chat.encode(text[len(self.text) :]), True, text)
        return NextPrompt(self.chat.encode(text), False, text)

    def commit(self, prompt: NextPrompt) -> None:
        """The policy is about to see `prompt`: its text is now what the tokens spell."""
        self.text = prompt.text

    def drop_oldest_observation(self, placeholder: str) -> bool:
        """Replace the oldest observation not yet dropped by `placeholder`; False when none is left."""
        for i in self._observations:
            if self.messages[i].get("content") != placeholder:
                self.messages[i] = {**self.messages[i], "content": placeholder}
                return True
        return False

    def restart_from_summary(self, summary: str) -> None:
        """The history becomes the episode's first messages plus the policy's summary (context 'summarise')."""
        self.messages = [*self.initial, {"role": "user", "content": f"Summary of your work so far:\n{summary}"}]
        self._observations = []

    def tokens_count(self, prompt: NextPrompt, current: int) -> int:
        """Length of the prompt `prompt` makes, given `current` tokens so far."""
        return current + len(prompt.ids) if prompt.extends else len(prompt.ids)

"""Thinking (`<think>...</think>`) in sampled text: what the environment, answer extraction and tool-call parsing see.

A thinking model writes its reasoning before the answer. Only the answer reaches the environment (its tool-call
parser and answer extraction) and the transcript's `content`; the reasoning is kept as `reasoning_content`, the key
Qwen3-style chat templates read (docs/models.md, 'Thinking models').
"""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_thinking(text: str) -> tuple[str, str]:
    """(reasoning, answer) of one assistant turn's text. Text after the last `</think>` is the answer; a turn that
    opened `<think>` and never closed it is all reasoning (nothing of it reaches a parser)."""
    if THINK_CLOSE in text:
        head, _, answer = text.rpartition(THINK_CLOSE)
        return head.split(THINK_OPEN)[-1].strip("\n"), answer.lstrip("\n")
    if THINK_OPEN in text:
        before, _, reasoning = text.partition(THINK_OPEN)
        return reasoning.strip("\n"), before.strip()
    return "", text


def assistant_message(text: str) -> dict[str, Any]:
    """The transcript message of one sampled turn: the answer as content, the reasoning (if any) beside it."""
    reasoning, answer = split_thinking(text)
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    if reasoning or THINK_OPEN in text:
        message["reasoning_content"] = reasoning
    return message


def turn_text(message: dict[str, Any]) -> str:
    """An assistant message as the model wrote it, for people reading records: its thinking (if any), then content."""
    content = str(message.get("content") or "")
    if "reasoning_content" not in message:
        return content
    return f"{THINK_OPEN}\n{message['reasoning_content']}\n{THINK_CLOSE}\n\n{content}"


def think_token_ids(tokenizer: Any) -> tuple[int, int] | None:
    """The ids of `<think>` and `</think>` when the vocabulary has each as one token, else None."""
    ids = []
    for tag in (THINK_OPEN, THINK_CLOSE):
        tid = tokenizer.convert_tokens_to_ids(tag)
        if tid is None or tid == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(tid) != tag:
            return None
        ids.append(int(tid))
    return ids[0], ids[1]


def thinking_token_count(sampled: list[int], tags: tuple[int, int] | None) -> int:
    """Sampled tokens between `<think>` and `</think>` (the tags excluded; to the turn's end if never closed)."""
    if tags is None or tags[0] not in sampled:
        return 0
    start = sampled.index(tags[0]) + 1
    end = sampled.index(tags[1], start) if tags[1] in sampled[start:] else len(sampled)
    return end - start

"""SFT data: the row formats, their tokenization, and the seeded order in which batches are drawn.

Two row formats, mixed freely in one file (docs/sft.md):

- `{"messages": [...], "tools": [...]?}`: a chat conversation;
- `{"prompt": ..., "completion": ...}`: each a string (a user turn / an assistant turn) or a list of messages
  (TRL's conversational prompt-completion form).

Both become one conversation, tokenized by the agent loop's own function (`ChatTokenizer.encode_conversation`), so
SFT sequences are the sequences RL samples; `train_roles` says which messages carry loss.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from typing import Any

from thermik.data.chat_tokenizer import ChatTokenizer
from thermik.envs.base import Message

Example = tuple[list[int], list[int]]  # (token ids, loss mask)


def load_conversations(path: str) -> list[dict[str, Any]]:
    """Rows of a jsonl file as {"messages", "tools"?} conversations (prompt/completion rows converted)."""
    if not path:
        raise ValueError("train_path is empty: pass --train_path FILE.jsonl (e.g. from `thermik synthesize`)")
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                rows.append(as_conversation(json.loads(line), f"{path}:{i}"))
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


def as_conversation(row: dict[str, Any], where: str) -> dict[str, Any]:
    """A messages row as it is; a prompt/completion row as the conversation prompt + completion."""
    if "messages" in row:
        return row
    if "prompt" in row and "completion" in row:
        messages = _turns(row["prompt"], "user", where) + _turns(row["completion"], "assistant", where)
        return {**{k: v for k, v in row.items() if k not in ("prompt", "completion")}, "messages": messages}
    raise ValueError(
        f"{where}: a row needs 'messages' (a chat) or 'prompt' and 'completion' (strings or message lists); "
        f"it has {sorted(row)}"
    )


def _turns(part: Any, role: str, where: str) -> list[Message]:
    if isinstance(part, str):
        return [{"role": role, "content": part}]
    if isinstance(part, list) and all(isinstance(m, dict) and "role" in m for m in part):
        return list(part)
    raise ValueError(f"{where}: a prompt or completion is a string or a list of {{'role', 'content'}} messages")


def encode_all(
    chat: ChatTokenizer,
    rows: list[dict[str, Any]],
    max_length: int,
    render_tools: bool = True,
    roles: Collection[str] = ("assistant",),
) -> list[Example]:
    """Tokenize as the agent loop will (tools rendered exactly when env.render_tools is on), cut to max_length (0:
    uncut). Whether any token still carries loss is the SFT run's verdict (runs/verdict.py)."""
    out = []
    for row in rows:
        ids, mask = chat.encode_conversation(row["messages"], row.get("tools") if render_tools else None, roles)
        out.append((ids, mask))
    return truncate(out, max_length)


def truncate(examples: list[Example], max_length: int) -> list[Example]:
    """Each example cut to its first max_length tokens (0: uncut)."""
    return [(ids[: max_length or None], mask[: max_length or None]) for ids, mask in examples]


def trains(example: Example) -> bool:
    """Some token of the example carries loss (the first never does: it has no prediction)."""
    return any(example[1][1:])


class DataOrder:
    """Batches drawn through seeded epochs: epoch e is a permutation of the examples fixed by (seed, e), so the
    position (examples drawn so far) is the whole state a checkpoint needs to continue the same sequence."""

    def __init__(self, size: int, seed: int, position: int = 0) -> None:
        if size < 1:
            raise ValueError("DataOrder needs at least one example")
        self.size, self.seed, self.position = size, seed, position
        self._epoch, self._perm = -1, list[int]()

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, list(range(self.size))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._perm)
        return self._perm

    def next_batch(self, n: int) -> list[int]:
        """The indices of the next `n` examples (an epoch boundary inside a batch continues in the next epoch)."""
        out = []
        for _ in range(n):
            epoch, index = divmod(self.position, self.size)
            out.append(self._permutation(epoch)[index])
            self.position += 1
        return out

"""SFT data: the row formats, their tokenization, and the seeded order in which batches are drawn.

Two row formats, mixed freely in one file (docs/sft.md):

- `{"messages": [...], "tools": [...]?}`: a chat conversation;
- `{"prompt": ..., "completion": ...}`: each a string (a user turn / an assistant turn) or a list of messages
  (TRL's conversational prompt-completion form).

The rows come from any dataset on disk RL reads (`thermik.data.disk.read_records`: .jsonl, .parquet, .arrow, a
save_to_disk directory); with a column mapping (`columns.prompt`, `columns.answer`) each record becomes a
prompt/completion row instead.

Both become one conversation, tokenized by the agent loop's own function (`ChatTokenizer.encode_conversation`), so
SFT sequences are the sequences RL samples; `train_roles` says which messages carry loss.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from pathlib import Path
from typing import Any

from thermik.config.schema import DataColumnsConfig
from thermik.data.dataset import DatasetError
from thermik.data.disk import read_records
from thermik.envs.base import Message
from thermik.models.chat import ChatTokenizer

Example = tuple[list[int], list[int]]  # (token ids, loss mask)


def load_conversations(
    path: str, columns: DataColumnsConfig | None = None, split: str = "train"
) -> list[dict[str, Any]]:
    """The records of a dataset on disk as {"messages", "tools"?} conversations (prompt/completion rows converted;
    `columns.prompt` set: each record mapped onto a prompt/completion row). `split`: of a save_to_disk DatasetDict."""
    if not path:
        raise DatasetError(
            "train_path is empty: pass --train_path FILE (.jsonl, .parquet, .arrow or a save_to_disk directory; e.g. "
            "from `thermik synthesize`)"
        )
    columns = columns or DataColumnsConfig()
    records = read_records(Path(path), split)
    rows = [
        as_conversation(_mapped(r, columns, f"{path} row {i}"), f"{path} row {i}") for i, r in enumerate(records, 1)
    ]
    if not rows:
        raise DatasetError(f"{path} holds no rows")
    return rows


def _mapped(record: Any, columns: DataColumnsConfig, where: str) -> Any:
    """A record of another schema as a prompt/completion row: the prompt column (after columns.system_prompt), the
    answer column as the completion."""
    if not columns.prompt or not isinstance(record, dict):
        return record
    for name in (columns.prompt, columns.answer):
        if not name or name not in record:
            raise DatasetError(
                f"{where}: no column {name!r} (SFT maps columns.prompt and columns.answer, the completion); columns: "
                f"{', '.join(sorted(record))}"
            )
    prompt = _turns(record[columns.prompt], "user", where)
    system = [{"role": "system", "content": columns.system_prompt}] if columns.system_prompt else []
    return {"prompt": system + prompt, "completion": record[columns.answer]}


def as_conversation(row: Any, where: str) -> dict[str, Any]:
    """A messages row as it is; a prompt/completion row as the conversation prompt + completion. Keys a columnar
    file (parquet, arrow) fills with None for rows and messages that lack them are dropped."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
    row = {k: v for k, v in row.items() if v is not None}
    if isinstance(row.get("messages"), list):
        return {**row, "messages": _turns(row["messages"], "user", where)}
    if "prompt" in row and "completion" in row:
        messages = _turns(row["prompt"], "user", where) + _turns(row["completion"], "assistant", where)
        return {**{k: v for k, v in row.items() if k not in ("prompt", "completion")}, "messages": messages}
    raise DatasetError(
        f"{where}: a row needs 'messages' (a chat) or 'prompt' and 'completion' (strings or message lists); "
        f"it has {sorted(row)}"
    )


def _turns(part: Any, role: str, where: str) -> list[Message]:
    if isinstance(part, str):
        return [{"role": role, "content": part}]
    if isinstance(part, list) and all(isinstance(m, dict) and "role" in m for m in part):
        return [{k: v for k, v in m.items() if v is not None} for m in part]
    raise DatasetError(f"{where}: a prompt or completion is a string or a list of {{'role', 'content'}} messages")


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

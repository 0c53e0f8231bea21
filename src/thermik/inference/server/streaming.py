"""Server-sent events for `stream: true`.

The engine returns whole generations, so a stream is cut from finished choices: one chunk per sampled token
(text pieces that concatenate to the non-streamed text), then a chunk with the finish reason, an optional
usage chunk, and `data: [DONE]`. Clients see the OpenAI chunk shapes; time to first token is the full time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from thermik.inference.server.outputs import Choice, Detokenizer, stream_pieces

ChunkChoices = Callable[[Choice, int, str], dict[str, Any]]
"""(choice, token position, text piece) -> the choice entry of one chunk."""


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def _token_chunks(
    choices: Sequence[Choice], detok: Detokenizer, make_entry: ChunkChoices
) -> Iterator[list[dict[str, Any]]]:
    for choice in choices:
        for pos, piece in enumerate(stream_pieces(detok, choice.token_ids, choice.text)):
            yield [make_entry(choice, pos, piece)]


async def event_stream(
    head: dict[str, Any],
    choices: Sequence[Choice],
    detok: Detokenizer,
    first: Sequence[list[dict[str, Any]]],
    make_entry: ChunkChoices,
    last: Sequence[list[dict[str, Any]]],
    usage: dict[str, int] | None,
) -> AsyncIterator[str]:
    """`head` holds id/object/created/model; `first` and `last` are choice lists sent before and after the tokens."""
    for entries in first:
        yield sse({**head, "choices": entries})
    for entries in _token_chunks(choices, detok, make_entry):
        yield sse({**head, "choices": entries})
    for entries in last:
        yield sse({**head, "choices": entries})
    if usage is not None:
        yield sse({**head, "choices": [], "usage": usage})
    yield sse("[DONE]")

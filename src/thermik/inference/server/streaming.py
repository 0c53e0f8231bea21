"""Server-sent events for `stream: true`, sent while the engine samples.

Each choice reads an engine stream (`TokenDelta`s, then the `Generation`; an engine without `stream` gives its
finished generation as the only item). `ChoiceStream` decides which sampled tokens are final: a token's text is
sent once it holds whole characters and cannot become part of a stop string (the last `len(longest stop) - 1`
characters wait) or of a tool call (text from a `<tool_call>` prefix on waits); the newest token always waits
for the next one, since a tokenizer may still change how it decodes. When the generation ends, the rest is cut
as in the unstreamed reply (`outputs.finish`), so the pieces concatenate to exactly the unstreamed text. Chunks
of several choices interleave as they are produced; then an optional usage chunk and `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from thermik.inference.base import Generation, StreamItem, TokenDelta
from thermik.inference.server.errors import error_body
from thermik.inference.server.outputs import Choice, Detokenizer, finish, stream_pieces

Entries = list[list[dict[str, Any]]]
"""Chunks, each given by its `choices` list."""
TokenEntry = Callable[[Choice, int, str], dict[str, Any]]
"""(choice so far, token position, text piece) -> the choice entry of one token's chunk."""
FinalEntries = Callable[["ChoiceStream", Choice], Entries]
"""(stream, finished choice) -> the choice's closing chunks (the rest of its tokens, tool calls, finish reason)."""


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def _marker_start(text: str, marker: str) -> int:
    """Where `marker` starts in text, or where a suffix of text that could begin it starts, else len(text)."""
    found = text.find(marker)
    if found != -1:
        return found
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return len(text) - size
    return len(text)


class ChoiceStream:
    """One choice's sampled tokens and how much of them has been sent; see the module docstring."""

    def __init__(
        self,
        index: int,
        prompt_ids: list[int],
        detok: Detokenizer,
        stops: Sequence[str],
        stop_ids: frozenset[int],
        hold_from: str | None = None,
    ) -> None:
        self.index, self.prompt_ids, self.detok = index, prompt_ids, detok
        self.stops, self.stop_ids, self.hold_from = tuple(stops), stop_ids, hold_from
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] | None = None
        self.sent = 0  # tokens sent
        self.sent_text = ""  # their text
        self._start = 0  # first sent token whose text is not in sent_text yet (it ends inside a character)

    def snapshot(self) -> Choice:
        return Choice(self.index, self.prompt_ids, self.token_ids, self.logprobs, self.top_logprobs, self.sent_text,
                      "", 0)  # fmt: skip

    def add(self, delta: TokenDelta) -> list[tuple[int, str]]:
        """Take new tokens; return (position, text piece) of each token that can be sent now."""
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs
        if delta.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + delta.top_logprobs
        text = self.detok.text(self.token_ids, self.stop_ids)
        limit = len(text) - max((len(s) - 1 for s in self.stops), default=0)  # a stop string may still complete
        limit = min([limit, *(found for s in self.stops if (found := text.find(s)) != -1)])  # or be complete
        if self.hold_from is not None:
            limit = len(text[: min(limit, _marker_start(text, self.hold_from))].rstrip())
        ready = []
        for k in range(self.sent, len(self.token_ids) - 1):
            pending = self.detok.decode(self.token_ids[self._start : k + 1])
            if pending and not pending.endswith("\ufffd") and text.startswith(self.sent_text + pending):
                if len(self.sent_text) + len(pending) > limit:
                    break
                self.sent_text += pending
                self._start = k + 1
                ready.append((k, pending))
            else:
                ready.append((k, ""))  # its text comes with a later token
            self.sent = k + 1
        return ready

    def finish(self, gen: Generation) -> Choice:
        return finish(gen, self.index, self.prompt_ids, self.detok, self.stops, self.stop_ids)

    def rest(self, choice: Choice) -> list[tuple[int, str]]:
        """(position, piece) of the finished choice's unsent tokens; the pieces complete its text."""
        pieces = stream_pieces(self.detok, choice.token_ids, choice.text, self.sent, self._start, len(self.sent_text))
        return list(zip(range(self.sent, len(choice.token_ids)), pieces, strict=True))


async def finished(gen: Generation) -> AsyncIterator[StreamItem]:
    """A generation that is already complete, as a stream (engines without `stream`)."""
    yield gen


async def event_stream(
    head: dict[str, Any],
    sources: Sequence[AsyncIterator[StreamItem]],
    streams: Sequence[ChoiceStream],
    first: Entries,
    token_entry: TokenEntry,
    final_entries: FinalEntries,
    usage: Callable[[list[Choice]], dict[str, int] | None],
    on_finish: Callable[[Choice], None] | None = None,
) -> AsyncIterator[str]:
    """`head` holds id/object/created/model; `first` is sent before any token; `usage` of the finished choices;
    `on_finish` sees each finished choice before its closing chunks are sent."""
    for entries in first:
        yield sse({**head, "choices": entries})
    queue: asyncio.Queue[tuple[int, StreamItem | Exception]] = asyncio.Queue()

    async def pump(i: int, source: AsyncIterator[StreamItem]) -> None:
        try:
            async for item in source:
                await queue.put((i, item))
        except Exception as exc:  # an engine failure mid-stream ends the stream with an error event
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, source)) for i, source in enumerate(sources)]
    done: dict[int, Choice] = {}
    try:
        while len(done) < len(sources):
            i, item = await queue.get()
            stream = streams[i]
            if isinstance(item, Exception):
                yield sse(error_body(f"generation failed: {item}", "server_error", None, None))
                return
            if isinstance(item, TokenDelta):
                for pos, piece in stream.add(item):
                    yield sse({**head, "choices": [token_entry(stream.snapshot(), pos, piece)]})
                continue
            done[i] = stream.finish(item)
            if on_finish is not None:
                on_finish(done[i])
            for entries in final_entries(stream, done[i]):
                yield sse({**head, "choices": entries})
        summary = usage([done[i] for i in range(len(sources))])
        if summary is not None:
            yield sse({**head, "choices": [], "usage": summary})
        yield sse("[DONE]")
    finally:
        for task in tasks:  # a client that went away cancels the engine requests still running
            task.cancel()

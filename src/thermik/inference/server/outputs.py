"""Engine Generations -> OpenAI response pieces: text, stop-string cut, tool calls, logprobs, stream pieces."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thermik.inference.base import Generation
from thermik.tools.parsers import parse_hermes_tool_calls


@dataclass
class Choice:
    """One finished choice, cut at the first stop string; `text` excludes the stop string and stop token."""

    index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None
    text: str
    finish_reason: str
    weight_version: int
    weight_versions: list[int] | None = None
    """Per kept token, the weight version that sampled it (None in a stream's snapshot)."""


def versions(choice: Choice) -> dict[str, Any]:
    """The weight version fields of a choice with token ids: `weight_version` (the last token's) and, thermik's
    addition, `weight_versions`, one per token (a request running through an in-flight weight update spans two)."""
    per_token = choice.weight_versions or [choice.weight_version] * len(choice.token_ids)
    return {"weight_version": choice.weight_version, "weight_versions": list(per_token)}


class Detokenizer:
    """Text of token ids as the API returns it: special tokens kept (tool-call tags are special), stop token cut."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def text(self, ids: Sequence[int], extra_stop_ids: frozenset[int] = frozenset()) -> str:
        if ids and ids[-1] in (self.stop_token_ids | extra_stop_ids):
            ids = ids[:-1]
        return self.decode(ids)

    def token_string(self, token_id: int, as_token_id: bool) -> str:
        return f"token_id:{token_id}" if as_token_id else self.decode([token_id])


def _first_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest stop string in text, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i != -1]
    return min(found) if found else -1


def finish(
    gen: Generation, index: int, prompt_ids: list[int], detok: Detokenizer, stops: Sequence[str], stop_ids: frozenset
) -> Choice:
    """Cut a generation at its first stop string (OpenAI semantics: the string itself is not returned).

    The tokens kept run up to and including the one that completed the string, as the engine contract says;
    cutting here too makes stop strings work whether or not the engine implements them.
    """
    ids, reason = list(gen.token_ids), gen.stop_reason
    text = detok.text(ids, stop_ids)
    cut = _first_stop(text, stops) if stops else -1
    if cut != -1:
        # Containment is monotone in the prefix length: binary search the shortest prefix holding a stop string.
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if _first_stop(detok.decode(ids[:mid]), stops) != -1:
                hi = mid
            else:
                lo = mid + 1
        ids, text, reason = ids[:lo], text[:cut], "stop"
    k = len(ids)
    return Choice(
        index=index,
        prompt_ids=prompt_ids,
        token_ids=ids,
        logprobs=list(gen.logprobs[:k]),
        top_logprobs=None if gen.top_logprobs is None else list(gen.top_logprobs[:k]),
        text=text,
        finish_reason=reason,
        weight_version=gen.weight_version,
        weight_versions=list(gen.weight_versions[:k]) if gen.weight_versions else [gen.weight_version] * k,
    )


def tool_calls_of(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the calls or None, OpenAI tool_calls) of an assistant text in the Hermes format.

    Blocks that fail to parse stay in the content, so nothing the model wrote is lost.
    """
    parsed = parse_hermes_tool_calls(text)
    if not parsed.calls:
        return text, []
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in parsed.calls
    ]
    leftovers = [parsed.content, *(e.raw for e in parsed.errors)]
    content = "\n".join(p for p in leftovers if p.strip())
    return content or None, calls


def chat_logprobs(choice: Choice, detok: Detokenizer, top: int, as_ids: bool, span: slice = slice(None)) -> dict:
    """`logprobs` of a chat choice: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        s = detok.token_string(token_id, as_ids)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    content = []
    tops = choice.top_logprobs or []
    for pos in range(len(choice.token_ids))[span]:
        item = entry(choice.token_ids[pos], choice.logprobs[pos])
        ranked = sorted(tops[pos].items(), key=lambda kv: -kv[1])[:top] if pos < len(tops) else []
        item["top_logprobs"] = [entry(t, lp) for t, lp in ranked]
        content.append(item)
    return {"content": content}


def completion_logprobs(choice: Choice, detok: Detokenizer, top: int, as_ids: bool, span: slice = slice(None)) -> dict:
    """`logprobs` of a text completion choice: {tokens, token_logprobs, top_logprobs, text_offset}."""
    positions = range(len(choice.token_ids))[span]
    tokens = [detok.token_string(choice.token_ids[p], as_ids) for p in positions]
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    tops = choice.top_logprobs or []
    top_lists = [
        {
            detok.token_string(t, as_ids): lp
            for t, lp in (sorted(tops[p].items(), key=lambda kv: -kv[1])[:top] if p < len(tops) else [])
        }
        for p in positions
    ]
    return {
        "tokens": tokens,
        "token_logprobs": [choice.logprobs[p] for p in positions],
        "top_logprobs": top_lists if top > 0 else None,
        "text_offset": offsets,
    }


def stream_pieces(
    detok: Detokenizer, ids: Sequence[int], text: str, first: int = 0, start: int = 0, emitted: int = 0
) -> list[str]:
    """One text piece per token of ids[first:] whose concatenation is text[emitted:]; `start` is the first token
    whose text is not in text[:emitted] yet (the defaults: the whole choice).

    A token that ends inside a multi-byte character, the stop token and tokens past a stop string get an empty
    piece; their text arrives with a later piece (the last piece carries whatever is left).
    """
    pieces: list[str] = []
    for k in range(first, len(ids)):
        pending = detok.decode(ids[start : k + 1])
        if pending and not pending.endswith("\ufffd") and text[emitted : emitted + len(pending)] == pending:
            pieces.append(pending)
            emitted += len(pending)
            start = k + 1
        else:
            pieces.append("")
    if pieces:
        pieces[-1] += text[emitted:]
    return pieces


def usage(prompts: Sequence[Sequence[int]], choices: Sequence[Choice]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }

"""Streaming while the engine samples: `EmbeddedEngine.stream`, which tokens `ChoiceStream` may send early, and
the server sending chunks before a generation ends (and cancelling it when the client goes away)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serving import running
from transformers import AutoModelForCausalLM, AutoTokenizer

from thermik.inference.base import Generation, SamplingParams, StreamItem, TokenDelta
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.server.app import build_app
from thermik.inference.server.outputs import Detokenizer
from thermik.inference.server.streaming import ChoiceStream
from thermik.tools.parsers import TOOL_CALL_OPEN, format_hermes_tool_call

MODEL = "tiny"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _feed(stream: ChoiceStream, ids: list[int], eos: int) -> tuple[list[str], str]:
    """Feed ids one token at a time, then finish; (sent text after each token, all pieces joined)."""
    seen, pieces = [], []
    for token in ids:
        pieces += [piece for _, piece in stream.add(TokenDelta([token], [-0.1]))]
        seen.append(stream.sent_text)
    choice = stream.finish(Generation(ids, [-0.1] * len(ids), "stop", 0, [0] * len(ids)))
    rest = stream.rest(choice)
    assert [pos for pos, _ in rest] == list(range(len(ids) - len(rest), len(choice.token_ids)))
    pieces += [piece for _, piece in rest]
    assert "".join(pieces) == choice.text
    return seen, choice.text


def test_text_before_a_stop_string_streams_and_the_stop_string_never_does(tokenizer: Any) -> None:
    detok = Detokenizer(tokenizer, [tokenizer.eos_token_id])
    ids = tokenizer.encode("The answer is 42. END of reply", add_special_tokens=False)
    stream = ChoiceStream(0, [1], detok, ["END"], frozenset())
    end = "The answer is 42. END".index("END")
    cut = next(k for k in range(1, len(ids) + 1) if "END" in tokenizer.decode(ids[:k]))
    seen, text = _feed(stream, ids[:cut], tokenizer.eos_token_id)
    assert text == "The answer is 42. "
    assert all("The answer is 42. "[: len(s)] == s and len(s) <= end for s in seen)
    assert seen[cut - 4] != ""  # most of the reply went out before the generation ended


def test_a_tool_call_is_held_back_from_its_first_character(tokenizer: Any) -> None:
    detok = Detokenizer(tokenizer, [tokenizer.eos_token_id])
    reply = "Let me compute.\n" + format_hermes_tool_call("calculate", {"expression": "2+3"})
    ids = tokenizer.encode(reply, add_special_tokens=False)
    stream = ChoiceStream(0, [1], detok, [], frozenset(), hold_from=TOOL_CALL_OPEN)
    seen, _ = _feed(stream, ids, tokenizer.eos_token_id)
    assert max(seen, key=len) == "Let me compute."  # the newline and the call wait for the end


def test_multibyte_characters_are_sent_whole(tokenizer: Any) -> None:
    detok = Detokenizer(tokenizer, [tokenizer.eos_token_id])
    ids = tokenizer.encode("naïve café ☕ done", add_special_tokens=False)
    seen, text = _feed(ChoiceStream(0, [1], detok, [], frozenset()), ids, tokenizer.eos_token_id)
    assert text == "naïve café ☕ done"
    assert all("\ufffd" not in s and text.startswith(s) for s in seen)


@pytest.fixture(scope="module")
def engine_and_tokenizer(tiny_model_dir: Path, tokenizer: Any) -> Iterator[tuple[Any, Any]]:
    """The embedded engine without stop tokens: every generation runs to max_tokens."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    engine = EmbeddedEngine(model, eos_token_ids=(), pad_token_id=tokenizer.pad_token_id or 0)
    yield engine, tokenizer
    asyncio.run(engine.close())


def test_engine_stream_yields_the_generation_token_by_token(engine_and_tokenizer: tuple[Any, Any]) -> None:
    engine, _ = engine_and_tokenizer
    sampling = SamplingParams(max_tokens=24, seed=5)

    async def run() -> tuple[list[StreamItem], Generation]:
        items = [item async for item in engine.stream([5, 6, 7, 8], sampling)]
        return items, await engine.generate([5, 6, 7, 8], sampling)

    items, plain = asyncio.run(run())
    *deltas, final = items
    assert isinstance(final, Generation) and all(isinstance(d, TokenDelta) for d in deltas)
    assert len(deltas) >= 2 and len(final.token_ids) == 24  # tokens arrived in several pieces, before the end
    assert [t for d in deltas for t in d.token_ids] == final.token_ids == plain.token_ids
    assert [lp for d in deltas for lp in d.logprobs] == final.logprobs
    with pytest.raises(ValueError, match="prompt_ids is empty"):  # bad input fails at the call, not mid-stream
        asyncio.run(_open_empty(engine))


async def _open_empty(engine: Any) -> None:
    engine.stream([], SamplingParams())


class GatedEngine:
    """Streams a scripted reply; after its first token it waits until the test saw a chunk (or 10 s pass)."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        self.client_saw_a_chunk = threading.Event()
        self.released_by_client: bool | None = None
        self.weight_version = 0

    def stream(self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None):
        async def items() -> AsyncIterator[StreamItem]:
            for k, token in enumerate(self.ids):
                yield TokenDelta([token], [-0.5])
                if k == 2:
                    self.released_by_client = await asyncio.to_thread(self.client_saw_a_chunk.wait, 10)
            yield Generation(self.ids, [-0.5] * len(self.ids), "stop", 0, [0] * len(self.ids))

        return items()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None):
        raise AssertionError("a streamed request must not wait for the whole generation")

    async def close(self) -> None:
        return None


def test_chunks_reach_the_client_before_the_generation_ends(tokenizer: Any) -> None:
    engine = GatedEngine(tokenizer, "Streaming works token by token.")
    with running(build_app(engine, tokenizer, MODEL)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        text = ""
        for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                if text:
                    engine.client_saw_a_chunk.set()
    assert engine.released_by_client is True
    assert text == "Streaming works token by token."


def test_a_client_that_goes_away_cancels_its_generation(engine_and_tokenizer: tuple[Any, Any]) -> None:
    engine, tok = engine_and_tokenizer
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 400, "stream": True}
    with running(build_app(engine, tok, MODEL, max_model_len=512)) as url:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            lines = resp.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first.removeprefix("data: "))["choices"][0]["finish_reason"] is None
            assert engine.scheduler.running()  # still sampling when the client hangs up
        deadline = time.monotonic() + 10
        while engine.scheduler.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.scheduler.running()

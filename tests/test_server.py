"""`thermik inference`: the OpenAI-compatible server on a loopback port, driven by the official openai SDK.

The main server runs the real embedded engine over the tiny model. Replies that an untrained model cannot be made
to produce (a tool call, a stop string) are tested through the same HTTP stack with `ScriptedEngine`, which
replays known token ids.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from serving import embedded_engine, running

from thermik.inference.base import SamplingParams
from thermik.inference.server.app import build_app
from thermik.models.presets import init_model

MODEL = "tiny"
MAX_MODEL_LEN = 512
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[str, Any, Any]]:
    """(base URL, engine, tokenizer) of a server over the embedded engine with the tiny model."""
    engine, tokenizer = embedded_engine(tiny_model_dir)
    app = build_app(engine, tokenizer, MODEL, max_model_len=MAX_MODEL_LEN)
    with running(app, on_exit=engine.close) as url:
        yield url, engine, tokenizer


@pytest.fixture(scope="module")
def client(served: tuple[str, Any, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, **kw: Any) -> ChatCompletion:
    args: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2+3?"}],
                            "max_tokens": 8, "seed": 7} | kw  # fmt: skip
    return client.chat.completions.create(**args)


def test_health_models_and_version(served: tuple[str, Any, Any], client: openai.OpenAI) -> None:
    url, engine, _ = served
    health = httpx.get(url + "/health").json()
    assert health == {"status": "ok", "model": MODEL, "weight_version": engine.weight_version}
    assert httpx.get(url + "/weight_version").json() == {"weight_version": engine.weight_version}
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_renders_tools_and_history_through_the_template(
    served: tuple[str, Any, Any], client: openai.OpenAI
) -> None:
    _, _, tokenizer = served
    call = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, seed=3, extra_body={"return_token_ids": True}
    )
    template_messages = [*messages[:2], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": {"expression": "2+3"}}}
    ]}, messages[3]]  # fmt: skip
    text = tokenizer.apply_chat_template(template_messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert '"name": "calculate"' in text and "<tool_response>5</tool_response>" in text
    assert reply.model_extra["prompt_token_ids"] == expected
    assert reply.usage.prompt_tokens == len(expected)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.completion_tokens == len(choice.model_extra["token_ids"]) <= 8
    without_tools = client.chat.completions.create(model=MODEL, messages=messages[:2], max_tokens=1)
    assert without_tools.usage.prompt_tokens < reply.usage.prompt_tokens


def test_completions_with_text_and_token_ids(served: tuple[str, Any, Any], client: openai.OpenAI) -> None:
    _, _, tokenizer = served
    text_prompt = "12+30="
    ids = tokenizer.encode(text_prompt, add_special_tokens=False)
    by_text = client.completions.create(
        model=MODEL, prompt=text_prompt, max_tokens=6, seed=11, extra_body={"return_token_ids": True}
    )
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, seed=11, extra_body={"return_token_ids": True}
    )
    a, b = by_text.choices[0], by_ids.choices[0]
    assert a.model_extra["prompt_token_ids"] == ids == b.model_extra["prompt_token_ids"]
    assert a.model_extra["token_ids"] == b.model_extra["token_ids"] and a.text == b.text
    out_ids = a.model_extra["token_ids"]
    if out_ids[-1] == tokenizer.eos_token_id:
        out_ids = out_ids[:-1]
    assert a.text == tokenizer.decode(out_ids, skip_special_tokens=False)
    batch = client.completions.create(
        model=MODEL, prompt=[ids, ids[:3]], n=2, max_tokens=4, seed=5, extra_body={"return_token_ids": True}
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.model_extra["prompt_token_ids"] for c in batch.choices] == [ids, ids, ids[:3], ids[:3]]
    assert batch.usage.prompt_tokens == len(ids) + 3
    assert batch.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in batch.choices)


def test_seeded_requests_match_the_engine_and_n_uses_seed_plus_i(
    served: tuple[str, Any, Any], client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    _, _, tokenizer = served
    ids = tokenizer.encode("hello", add_special_tokens=False)
    many = client.completions.create(
        model=MODEL, prompt=ids, n=3, max_tokens=8, seed=40, logprobs=0, extra_body={"return_token_ids": True}
    )
    sampled = [c.model_extra["token_ids"] for c in many.choices]
    assert len({tuple(s) for s in sampled}) > 1, "n samples with seeds seed+i should differ"
    single = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, seed=41, extra_body={"return_token_ids": True}
    )
    assert single.choices[0].model_extra["token_ids"] == sampled[1]
    local, _ = embedded_engine(tiny_model_dir)
    gen = asyncio.run(local.generate(ids, SamplingParams(max_tokens=8, seed=42)))
    assert gen.token_ids == sampled[2]
    assert many.choices[2].logprobs.token_logprobs == pytest.approx(gen.logprobs, abs=1e-5)


def _sse_events(url: str, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", url + path, json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        return [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]


def test_streaming_concatenates_to_the_unstreamed_text(served: tuple[str, Any, Any], client: openai.OpenAI) -> None:
    url = served[0]
    whole = _chat(client, max_tokens=12, seed=9, n=2)
    stream = _chat(client, max_tokens=12, seed=9, n=2, stream=True, stream_options={"include_usage": True})
    texts, finish, usage = ["", ""], [None, None], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    assert texts == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    body = {"model": MODEL, "prompt": "ab", "max_tokens": 10, "seed": 4, "logprobs": 0}
    plain = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    events = _sse_events(url, "/v1/completions", body | {"stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == plain["text"]
    streamed_lp = [
        lp for ch in chunks if ch["choices"][0]["logprobs"] for lp in ch["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert streamed_lp == plain["logprobs"]["token_logprobs"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["finish_reason"]


def test_64_concurrent_clients_complete(served: tuple[str, Any, Any]) -> None:
    async def main() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0) as aclient:
            calls = [
                aclient.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"{i}+1="}], max_tokens=8, seed=i
                )
                if i % 2
                else aclient.completions.create(model=MODEL, prompt=f"{i}*2=", max_tokens=8, seed=i)
                for i in range(64)
            ]
            return await asyncio.gather(*calls)

    replies = asyncio.run(main())
    assert len(replies) == 64
    assert all(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length") for r in replies)


def test_update_weights_changes_version_and_outputs(
    served: tuple[str, Any, Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    url = served[0]
    body = {"model": MODEL, "prompt": "7+8=", "max_tokens": 8, "temperature": 0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    before = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    version = httpx.get(url + "/weight_version").json()["weight_version"]
    other = init_model("qwen2-1m", tmp_path / "other", seed=1)
    resp = httpx.post(url + "/update_weights", json={"path": str(other)}, timeout=60)
    assert resp.status_code == 200 and resp.json() == {"weight_version": version + 1}
    after = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    assert before["weight_version"] == version and after["weight_version"] == version + 1
    assert after["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]
    # Back to the original weights (the server is shared by this module): the same greedy output returns.
    resp = httpx.post(url + "/update_weights", json={"path": str(tiny_model_dir)}, timeout=60)
    assert resp.json() == {"weight_version": version + 2}
    again = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    assert again["token_ids"] == before["token_ids"]
    assert httpx.get(url + "/health").json()["weight_version"] == version + 2

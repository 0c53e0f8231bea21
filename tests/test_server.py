"""`thermik inference`: the OpenAI-compatible server on a loopback port, driven by the official openai SDK.

The main server runs the real embedded engine over the tiny model. Replies that an untrained model cannot be made
to produce (a tool call, a stop string) are tested through the same HTTP stack with `ScriptedEngine`, which
replays known token ids.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import schemathesis
from conftest import run_thermik
from hypothesis import HealthCheck, settings
from openai.types.chat import ChatCompletion
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from serving import embedded_engine, running

from thermik.inference.base import Generation, SamplingParams
from thermik.inference.server.app import build_app
from thermik.models.presets import init_model
from thermik.tools.parsers import format_hermes_tool_call

MODEL = "tiny"
http = httpx.Client(timeout=120)  # generous: the 2 shared cores can be heavily loaded
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
    health = http.get(url + "/health").json()
    assert health == {"status": "ok", "model": MODEL, "weight_version": engine.weight_version}
    assert http.get(url + "/weight_version").json() == {"weight_version": engine.weight_version}
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
    with http.stream("POST", url + path, json=body) as resp:
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
    plain = http.post(url + "/v1/completions", json=body).json()["choices"][0]
    events = _sse_events(url, "/v1/completions", body | {"stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == plain["text"]
    streamed_lp = [
        lp for ch in chunks if ch["choices"][0]["logprobs"] for lp in ch["choices"][0]["logprobs"]["token_logprobs"]
    ]
    # Same seed, same tokens; the second request may reuse the first one's cached prefix, so logprobs agree to
    # float rounding rather than bit for bit.
    assert streamed_lp == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-5)
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
    before = http.post(url + "/v1/completions", json=body).json()["choices"][0]
    version = http.get(url + "/weight_version").json()["weight_version"]
    other = init_model("qwen2-1m", tmp_path / "other", seed=1)
    resp = http.post(url + "/update_weights", json={"path": str(other)})
    assert resp.status_code == 200 and resp.json() == {"weight_version": version + 1}
    after = http.post(url + "/v1/completions", json=body).json()["choices"][0]
    assert before["weight_version"] == version and after["weight_version"] == version + 1
    assert after["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]
    # Back to the original weights (the server is shared by this module): the same greedy output returns.
    resp = http.post(url + "/update_weights", json={"path": str(tiny_model_dir)})
    assert resp.json() == {"weight_version": version + 2}
    again = http.post(url + "/v1/completions", json=body).json()["choices"][0]
    assert again["token_ids"] == before["token_ids"]
    assert http.get(url + "/health").json()["weight_version"] == version + 2


def test_stop_strings_cut_the_text_where_the_engine_output_holds_them(
    served: tuple[str, Any, Any], client: openai.OpenAI
) -> None:
    _, _, tokenizer = served
    body: dict[str, Any] = {"model": MODEL, "prompt": "stop here", "max_tokens": 24, "seed": 21, "temperature": 0.7}
    full = client.completions.create(**body, extra_body={"return_token_ids": True}).choices[0]
    stop = full.text[5:7]
    assert len(stop) == 2 and full.text.find(stop) >= 0
    cut = client.completions.create(**body, stop=[stop, "never-there"], extra_body={"return_token_ids": True})
    choice = cut.choices[0]
    assert choice.text == full.text[: full.text.find(stop)] and choice.finish_reason == "stop"
    kept = choice.model_extra["token_ids"]
    assert kept == full.model_extra["token_ids"][: len(kept)]
    assert stop in tokenizer.decode(kept) and stop not in tokenizer.decode(kept[:-1])
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(**body, stop=stop, stream=True) if c.choices
    )
    assert streamed == choice.text


def test_top_logprobs_are_returned_sorted(client: openai.OpenAI) -> None:
    reply = _chat(client, logprobs=True, top_logprobs=3, max_tokens=4)
    for entry in reply.choices[0].logprobs.content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob <= tops[0] + 1e-6


# ---------------------------------------------------------------------------------------------- scripted replies


class ScriptedEngine:
    """Answers every request with the token ids of `text` (+ eos): steers replies an untrained model never writes."""

    def __init__(self, tokenizer: Any, text: str = "") -> None:
        self.tokenizer, self.text = tokenizer, text
        self.weight_version = 0

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        script = [*self.tokenizer.encode(self.text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = script[: sampling.max_tokens]
        reason = "stop" if len(ids) == len(script) else "length"
        return Generation(ids, [-0.5] * len(ids), reason, 0, [0] * len(ids))

    async def update_weights(self, source: Any) -> int:
        raise ValueError("a scripted engine has no weights")

    async def close(self) -> None:
        return None


API_KEY = "sk-test-key"


@pytest.fixture(scope="module")
def scripted(served: tuple[str, Any, Any]) -> Iterator[tuple[str, ScriptedEngine]]:
    engine = ScriptedEngine(served[2])
    with running(build_app(engine, served[2], MODEL, api_key=API_KEY, max_model_len=MAX_MODEL_LEN)) as url:
        yield url, engine


def _scripted_client(url: str, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_tool_calls_are_parsed_into_openai_tool_calls(scripted: tuple[str, ScriptedEngine]) -> None:
    url, engine = scripted
    engine.text = "Let me compute.\n" + format_hermes_tool_call("calculate", {"expression": "2+3"})
    raw = http.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "model": MODEL, "messages": [{"role": "user", "content": "2+3?"}], "tools": TOOLS,
    }).json()  # fmt: skip
    reply = ChatCompletion.model_validate(raw)  # the SDK's own schema accepts the response
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculate" and json.loads(call.function.arguments) == {"expression": "2+3"}
    plain = _scripted_client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS, tool_choice="none"
    )
    assert plain.choices[0].message.tool_calls is None and "<tool_call>" in plain.choices[0].message.content
    no_tools = _scripted_client(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert no_tools.choices[0].finish_reason == "stop" and no_tools.choices[0].message.tool_calls is None


def test_streamed_tool_calls_match_the_unstreamed_reply(scripted: tuple[str, ScriptedEngine]) -> None:
    url, engine = scripted
    engine.text = format_hermes_tool_call("calculate", {"expression": "7*6"})
    stream = _scripted_client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "7*6?"}], tools=TOOLS, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [("calculate", {"expression": "7*6"})]


def test_api_key_is_required_when_set(scripted: tuple[str, ScriptedEngine]) -> None:
    url, engine = scripted
    engine.text = "ok"
    with pytest.raises(openai.AuthenticationError) as exc:
        _scripted_client(url, "wrong-key").models.list()
    assert exc.value.status_code == 401
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": f"Bearer {API_KEY}x"}):
        resp = http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "a"}, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"] | {"message": ""} == ERROR_SHAPE | {"code": "invalid_api_key"}
    assert http.post(url + "/update_weights", json={"path": "/"}).status_code == 401
    assert http.get(url + "/health").status_code == 200  # liveness needs no key
    assert _scripted_client(url).completions.create(model=MODEL, prompt="a").choices[0].text == "ok"


ERROR_SHAPE = {"message": "", "type": "invalid_request_error", "param": None, "code": None}


_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
_TEXT = {"model": MODEL, "prompt": "hi"}
_BAD_CALL = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": "f", "arguments": "{not json"}}]}  # fmt: skip
_LONE = b'{"model": "tiny", %s}'
MALFORMED: list[tuple[str, str, Any, int, str | None]] = [
    # (method, path, JSON body or raw bytes, status, param named in the error)
    ("POST", "/v1/chat/completions", {"messages": _CHAT["messages"]}, 400, "model"),
    ("POST", "/v1/chat/completions", _CHAT | {"model": "gpt-9"}, 404, "model"),
    ("POST", "/v1/chat/completions", _CHAT | {"messages": []}, 400, "messages"),
    ("POST", "/v1/chat/completions", _CHAT | {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ("POST", "/v1/chat/completions", _CHAT | {"n": 0}, 400, "n"),
    ("POST", "/v1/chat/completions", _CHAT | {"n": 1000}, 400, "n"),
    ("POST", "/v1/chat/completions", _CHAT | {"temperature": -1}, 400, "temperature"),
    ("POST", "/v1/chat/completions", _CHAT | {"top_p": 0}, 400, "top_p"),
    ("POST", "/v1/chat/completions", _CHAT | {"max_tokens": 0}, 400, "max_tokens"),
    ("POST", "/v1/chat/completions", _CHAT | {"max_tokens": 10**6}, 400, "max_tokens"),
    ("POST", "/v1/chat/completions", _CHAT | {"max_completion_tokens": 10**6}, 400, "max_completion_tokens"),
    ("POST", "/v1/chat/completions", _CHAT | {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("POST", "/v1/chat/completions", _CHAT | {"stop": [""]}, 400, "stop"),
    ("POST", "/v1/chat/completions", _CHAT | {"top_logprobs": 3}, 400, "top_logprobs"),
    ("POST", "/v1/chat/completions", _CHAT | {"logprobs": True, "top_logprobs": 99}, 400, "top_logprobs"),
    ("POST", "/v1/chat/completions", _CHAT | {"frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ("POST", "/v1/chat/completions", _CHAT | {"tool_choice": "sometimes"}, 400, "tool_choice"),
    ("POST", "/v1/chat/completions", _CHAT | {"temperatur": 0.5}, 400, "temperatur"),
    (
        "POST",
        "/v1/chat/completions",
        _CHAT | {"messages": [_BAD_CALL]},
        400,
        "messages.0.tool_calls.0.function.arguments",
    ),
    (
        "POST",
        "/v1/chat/completions",
        _CHAT | {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages.0.content",
    ),
    ("POST", "/v1/chat/completions", _CHAT | {"stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("POST", "/v1/chat/completions", b"{not json", 400, None),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("POST", "/v1/completions", _TEXT | {"prompt": ""}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": []}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": [[]]}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": [1, "a"]}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": [5000]}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": [-1]}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": "x" * 600}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"logprobs": 50}, 400, "logprobs"),
    ("POST", "/v1/completions", _TEXT | {"echo": True}, 400, "echo"),
    ("POST", "/v1/completions", _TEXT | {"seed": 2**70}, 400, "seed"),
    ("POST", "/v1/completions", _TEXT | {"max_tokens": "many"}, 400, "max_tokens"),
    # a lone UTF-16 surrogate (raw bytes: httpx cannot encode one) is a 400, not a 500
    (
        "POST",
        "/v1/chat/completions",
        _LONE % b'"messages": [{"role": "user", "content": "a\\ud800"}]',
        400,
        "messages.0.content",
    ),
    (
        "POST",
        "/v1/chat/completions",
        _LONE % b'"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]',
        400,
        "messages.0.content",
    ),
    (
        "POST",
        "/v1/chat/completions",
        _LONE
        % (
            b'"messages": [{"role": "user", "content": "x"}], "tools": [{"type": '
            b'"function", "function": {"name": "f", "description": "\\ud800"}}]'
        ),
        400,
        "tools.0.function.description",
    ),
    ("POST", "/v1/completions", _LONE % b'"prompt": "\\ud800"', 400, "prompt"),
    ("POST", "/v1/completions", _LONE % b'"prompt": ["ok", "\\ud800x"]', 400, "prompt"),
    # a tool's parameters must be a JSON Schema
    (
        "POST",
        "/v1/chat/completions",
        _CHAT
        | {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense", "properties": 5}}}
            ]
        },
        400,
        "tools.0.function.parameters",
    ),
    # prompts x n is capped (200 x 64 would queue 12,800 generations)
    ("POST", "/v1/completions", _TEXT | {"prompt": ["a"] * 200, "n": 64}, 400, "prompt"),
    ("POST", "/v1/completions", _TEXT | {"prompt": [[5]] * 257}, 400, "prompt"),
    ("POST", "/update_weights", {}, 400, "path"),
    ("POST", "/update_weights", {"path": "/no/such/dir"}, 400, "path"),
    ("POST", "/update_weights", {"path": "/"}, 400, "path"),
    ("GET", "/v1/completions", None, 405, None),
    ("GET", "/v1/nothing-here", None, 404, None),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "param"), MALFORMED)
def test_malformed_requests_get_a_4xx_with_an_openai_error_body(
    scripted: tuple[str, ScriptedEngine], method: str, path: str, body: Any, status: int, param: str | None
) -> None:
    url, engine = scripted
    engine.text = "fine"
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    resp = http.request(method, url + path, headers=headers, **kw)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"] and error["param"] == param
    if isinstance(body, bytes) and b"\\ud" in body:
        assert "lone UTF-16 surrogate" in error["message"]


# ---------------------------------------------------------------------------------------------- schema fuzz

FUZZ_MAX_MODEL_LEN = 24  # keeps every generated request cheap: prompt + completion <= 24 tokens
# Generated examples only (positive and negative); the exhaustive coverage phase sends ~800 requests.
FUZZ_CONFIG = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}})


@pytest.fixture(scope="module")
def fuzz_schema(tiny_model_dir: Path) -> Iterator[Any]:
    """The OpenAPI description of a real-engine server, loaded by schemathesis from the live URL."""
    engine, tokenizer = embedded_engine(tiny_model_dir)
    app = build_app(engine, tokenizer, MODEL, max_model_len=FUZZ_MAX_MODEL_LEN)
    with running(app, on_exit=engine.close) as url:
        yield schemathesis.openapi.from_url(url + "/openapi.json", config=FUZZ_CONFIG)


def _openai_error_body(ctx: Any, response: Any, case: Any) -> bool:
    """Every 4xx carries {"error": {"message", "type", "param", "code"}}."""
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text
    return True


fuzz = schemathesis.pytest.from_fixture("fuzz_schema")


@pytest.mark.slow
@fuzz.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_schema_fuzz_finds_no_server_error(case: Any) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # reach the engine: a wrong name is a 404 before it (tested above)
    case.call_and_validate(checks=[not_a_server_error, _openai_error_body], timeout=120)


def test_thermik_inference_cli_resolves_its_config() -> None:
    res = run_thermik("inference", "--dry-run", "--server.port", "8123", "--server.api_key", "k")
    assert res.returncode == 0, res.stderr
    cfg = tomllib.loads(res.stdout)
    assert (
        cfg["server"]["port"] == 8123 and cfg["server"]["api_key"] == "k" and cfg["inference"]["backend"] == "embedded"
    )
    res = run_thermik("inference", "--inference.backend", "remote")
    assert res.returncode == 2 and "inference.backend" in res.stderr and "Traceback" not in res.stderr
    res = run_thermik("inference", "--server.prot", "1")
    assert res.returncode == 2 and "server.port" in res.stderr

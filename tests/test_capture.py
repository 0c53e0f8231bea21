"""thermik.capture: the official openai SDK plays episodes against per-episode endpoints on a loopback server, and
the recorded samples are checked token by token against what the engine itself was asked and sampled.

The real embedded engine over the tiny model serves plain turns; tool calls, which an untrained model never writes,
come from `ScriptedEngine` (known token ids through the same HTTP stack).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serving import embedded_engine, running

from thermik.capture import Capture, EpisodeHandle, EpisodeLimits
from thermik.inference.base import Generation, SamplingParams, StreamItem
from thermik.inference.server.app import build_app
from thermik.rollout.trajectory import Trajectory
from thermik.tools.parsers import format_hermes_tool_call

MODEL = "tiny"
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]  # fmt: skip
FLAT_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
http = httpx.Client(timeout=120)


class Recording:
    """Wraps an engine and keeps every (prompt ids, Generation) it served: the engine's own sampled ids."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], Generation]] = []
        if hasattr(inner, "stream"):  # the server streams from engines that have `stream`
            self.stream = self._stream

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, prompt: list[int], sampling: SamplingParams, session_id: str | None = None) -> Generation:
        gen = await self.inner.generate(prompt, sampling, session_id)
        self.calls.append((list(prompt), gen))
        return gen

    def _stream(self, prompt: list[int], sampling: SamplingParams, session_id: str | None = None) -> Any:
        source = self.inner.stream(prompt, sampling, session_id)

        async def items() -> AsyncIterator[StreamItem]:
            async for item in source:
                if isinstance(item, Generation):
                    self.calls.append((list(prompt), item))
                yield item

        return items()

    def end_session(self, session_id: str) -> None:
        getattr(self.inner, "end_session", lambda _: None)(session_id)

    async def update_weights(self, source: Any, version: int | None = None) -> int:
        return await self.inner.update_weights(source, version)

    async def close(self) -> None:
        await self.inner.close()


class ScriptedEngine:
    """Replies with the token ids of the next script (+ eos), each token with its own logprob; `delay` seconds
    before the first reply only."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.scripts, self.delay = tokenizer, [], 0.0
        self.weight_version = 3

    async def generate(self, prompt: list[int], sampling: SamplingParams, session_id: str | None = None) -> Generation:
        if self.delay:
            delay, self.delay = self.delay, 0.0
            await asyncio.sleep(delay)
        text = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        script = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = script[: sampling.max_tokens]
        logprobs = [-0.01 * (len(prompt) % 97 + k + 1) for k in range(len(ids))]
        return Generation(ids, logprobs, "stop" if len(ids) == len(script) else "length", 3, [3] * len(ids))

    async def update_weights(self, source: Any, version: int | None = None) -> int:
        raise ValueError("a scripted engine has no weights")

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def real(tiny_model_dir: Path) -> Iterator[tuple[Capture, Recording, str]]:
    engine, tokenizer = embedded_engine(tiny_model_dir)
    recording = Recording(engine)
    app = build_app(recording, tokenizer, MODEL, max_model_len=512)
    capture = Capture.over(app)
    with running(app, on_exit=engine.close) as url:
        capture.url = url
        yield capture, recording, url


@pytest.fixture(scope="module")
def scripted(tiny_model_dir: Path) -> Iterator[tuple[Capture, Recording, ScriptedEngine, str]]:
    from thermik.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    engine = ScriptedEngine(tokenizer)
    recording = Recording(engine)
    app = build_app(recording, tokenizer, MODEL, api_key="sk-server", max_model_len=512)
    capture = Capture.over(app)
    with running(app) as url:
        capture.url = url
        yield capture, recording, engine, url


def _client(handle: EpisodeHandle, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.base_url, api_key=handle.api_key, **({"max_retries": 0} | kw))


def check_against_engine(traj: Trajectory, recording: Recording, calls: slice) -> None:
    """Every sample is exactly the engine's prompts and sampled ids: each sampled span is what the engine sampled
    (ids, logprobs, weight versions) for exactly the tokens before it."""
    served = recording.calls[calls]
    spans = [(sample, s, e) for sample in traj.samples for s, e, _ in sample.turn_spans]
    assert len(spans) == len(served)
    for (sample, start, end), (prompt, gen) in zip(spans, served, strict=True):
        assert sample.prompt_ids + sample.response_ids[:start] == prompt
        assert sample.response_ids[start:end] == gen.token_ids
        assert sample.rollout_logprobs[start:end] == gen.logprobs
        assert sample.weight_versions[start:end] == (gen.weight_versions or [gen.weight_version] * len(gen.token_ids))
        assert sample.loss_mask[start:end] == [1] * len(gen.token_ids)
    for sample in traj.samples:
        assert sum(sample.loss_mask) == sum(e - s for s, e, _ in sample.turn_spans)


def accumulated_calls(deltas: list[Any]) -> list[dict[str, Any]]:
    """Streamed tool-call deltas joined as a client joins them: by index, the id and name from the first, the
    arguments concatenated."""
    calls: dict[int, dict[str, Any]] = {}
    for t in deltas:
        call = calls.setdefault(t.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = t.id or call["id"]
        call["function"]["name"] += (t.function and t.function.name) or ""
        call["function"]["arguments"] += (t.function and t.function.arguments) or ""
    return [calls[i] for i in sorted(calls)]


def _tool_loop(client: openai.OpenAI, model: str, stream: bool) -> list[dict[str, Any]]:
    """The SDK tool loop every harness runs: call the model, run the tools it asks for, until it answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    for _ in range(4):
        if stream:
            chunks = list(client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True,
                                                         stream_options={"include_usage": True}))  # fmt: skip
            assert chunks[-1].usage is not None and chunks[-1].choices == []
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = accumulated_calls([t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()])
            message = {"role": "assistant", "content": content or None, "tool_calls": calls}
        else:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            return messages
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})
    raise AssertionError("the loop did not end")


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_chat_tool_loop_is_one_token_exact_sample(scripted: Any, stream: bool) -> None:
    capture, recording, engine, _ = scripted
    engine.scripts = ["I will add.\n" + format_hermes_tool_call("add", {"a": 2, "b": 3}), "The answer is 5."]
    handle = capture.open(EpisodeLimits(max_turns=4))
    before = len(recording.calls)
    messages = _tool_loop(_client(handle), handle.model, stream)
    posted = http.post(handle.reward_url, json={"reward": 1.5, "metrics": {"solved": 1.0}, "extra": "ignored"})
    assert posted.status_code == 200, posted.text
    tool_result = {"role": "tool", "tool_call_id": messages[1]["tool_calls"][0]["id"], "content": "5"}
    assert messages[-1]["content"] == "The answer is 5." and messages[2] == tool_result
    traj = capture.close(handle.id)
    assert traj.continuations == [] and traj.num_turns == 2 and traj.env_metrics["capture_forks"] == 0
    check_against_engine(traj, recording, slice(before, None))
    assert traj.reward == 1.5 and traj.rewards[traj.turn_spans[-1][1] - 1] == 1.5 and traj.env_metrics["solved"] == 1
    # between the two sampled turns: only the tool result's rendering, never the first reply re-tokenized
    _, end, obs_end = traj.turn_spans[0]
    observation = capture.chat.tokenizer.decode(traj.response_ids[end:obs_end])
    assert "5" in observation and "add" not in observation


def test_streamed_tool_calls_arrive_as_openai_streams_them(scripted: Any) -> None:
    """Each call: a chunk with its id and name (arguments ""), then its arguments in pieces; the SDK's stream helper
    accumulates the same calls as the unstreamed reply, and the episode records the same tokens either way."""
    capture, recording, engine, _ = scripted
    script = "Adding.\n" + format_hermes_tool_call("add", {"a": 1234, "b": 5678}) + "\n"
    engine.scripts = [script + format_hermes_tool_call("add", {"a": 9, "b": 10})]
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Add them."}], "tools": TOOLS}
    recorded, replies = [], []
    for stream in (False, True):
        handle = capture.open()
        before = len(recording.calls)
        client = _client(handle)
        if stream:
            with client.chat.completions.stream(**kw) as events:
                deltas = [e.chunk.choices[0].delta for e in events if e.type == "chunk" and e.chunk.choices]
                replies.append(events.get_final_completion().choices[0].message)
        else:
            replies.append(client.chat.completions.create(**kw).choices[0].message)
        traj = capture.close(handle.id)
        check_against_engine(traj, recording, slice(before, None))
        recorded.append((traj.prompt_ids, traj.response_ids, traj.rollout_logprobs))
    assert recorded[0] == recorded[1]
    plain, streamed = replies
    assert streamed.content == plain.content == "Adding."
    assert (
        [(c.function.name, c.function.arguments) for c in streamed.tool_calls]
        == [(c.function.name, c.function.arguments) for c in plain.tool_calls]
        == [("add", '{"a": 1234, "b": 5678}'), ("add", '{"a": 9, "b": 10}')]
    )
    pieces = [t for d in deltas for t in d.tool_calls or ()]
    for index, call in enumerate(streamed.tool_calls):
        opening, *rest = [t for t in pieces if t.index == index]
        assert (opening.id, opening.type, opening.function.name, opening.function.arguments) == (
            call.id, "function", "add", "")  # fmt: skip
        assert len(rest) > 1 and all(t.id is None and not t.function.name for t in rest)
        assert "".join(t.function.arguments for t in rest) == call.function.arguments
    assert accumulated_calls(pieces) == [
        c.model_dump(exclude_none=True, exclude={"index"}) for c in streamed.tool_calls
    ]


def test_real_engine_chat_turns_streamed_and_not(real: Any) -> None:
    capture, recording, _ = real
    handle = capture.open()
    client, before = _client(handle), len(recording.calls)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for turn in range(3):
        if turn == 1:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(
                    model=handle.model, messages=messages, max_completion_tokens=6, stream=True, stop=["\n\n"]
                )
                if c.choices
            )
        else:
            reply = client.chat.completions.create(model=handle.model, messages=messages, max_tokens=6, seed=turn)
            text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and {turn}?"}]
    traj = capture.close(handle.id)
    assert traj.num_turns == 3 and traj.continuations == []
    check_against_engine(traj, recording, slice(before, None))


def _responses_loop(client: openai.OpenAI, model: str, stream: bool, chain: bool) -> list[Any]:
    """openai-agents' way: function calls answered with function_call_output, either by previous_response_id
    (`chain`) or by replaying the output items as the next input."""
    items: list[Any] = [{"role": "user", "content": "What is 2+3?"}]
    previous, responses = None, []
    for _ in range(4):
        kw: dict[str, Any] = {"model": model, "instructions": "Use the tools.", "tools": FLAT_TOOLS,
                              "input": items, "previous_response_id": previous}  # fmt: skip
        if stream:
            events = list(client.responses.create(stream=True, **kw))
            response = events[-1].response
            responses.append((events, response))
        else:
            response = client.responses.create(**kw)
            responses.append(([], response))
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            return responses
        outputs = [{"type": "function_call_output", "call_id": c.call_id,
                    "output": str(sum(json.loads(c.arguments).values()))} for c in calls]  # fmt: skip
        if chain:
            items, previous = outputs, response.id
        else:
            items = [*items, *[o.model_dump(exclude_none=True) for o in response.output], *outputs]
    raise AssertionError("the loop did not end")


TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]  # fmt: skip


@pytest.mark.parametrize(("stream", "chain"), [(False, True), (True, False), (True, True)])
def test_sdk_responses_function_calls_round_trip(scripted: Any, stream: bool, chain: bool) -> None:
    capture, recording, engine, _ = scripted
    engine.scripts = [format_hermes_tool_call("add", {"a": 2, "b": 3}), "It is 5."]
    handle = capture.open()
    before = len(recording.calls)
    responses = _responses_loop(_client(handle), handle.model, stream, chain)
    (events, first), (last_events, last) = responses[0], responses[-1]
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert last.status == "completed" and last.output_text == "It is 5." and len(responses) == 2
    if stream:
        kinds = [e.type for e in events]
        assert kinds[:2] == TEXT_EVENTS[:2] and kinds[-1] == "response.completed"
        assert kinds[2:-1] == ["response.output_item.added", "response.function_call_arguments.delta",
                               "response.function_call_arguments.done", "response.output_item.done"]  # fmt: skip
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text_kinds = [k for i, k in enumerate(e.type for e in last_events) if i == 0 or k != last_events[i - 1].type]
        assert text_kinds == TEXT_EVENTS
        deltas = "".join(e.delta for e in last_events if e.type == "response.output_text.delta")
        assert deltas == "It is 5." == last_events[-1].response.output[0].content[0].text
    _check_retrieval(capture, handle, [r for _, r in responses])
    traj = capture.close(handle.id)
    assert traj.num_turns == 2 and traj.continuations == []
    check_against_engine(traj, recording, slice(before, None))


def _check_retrieval(capture: Capture, handle: EpisodeHandle, responses: list[Any]) -> None:
    """`responses.retrieve` gives back each response of the episode as it was sent (by the episode's URL and by its
    key on the plain routes); an unknown id, or one of another episode, is a 404."""
    by_key = openai.OpenAI(base_url=f"{capture.url}/v1", api_key=handle.api_key, max_retries=0)
    for client in (_client(handle), by_key):
        assert [client.responses.retrieve(r.id) for r in responses] == responses
    other = capture.open()
    try:
        for client, response_id in ((_client(handle), "resp_unknown"), (_client(other), responses[0].id)):
            with pytest.raises(openai.NotFoundError, match="not one of this episode's"):
                client.responses.retrieve(response_id)
    finally:
        capture.close(other.id)


def test_edited_history_starts_a_second_sample(scripted: Any) -> None:
    capture, recording, engine, _ = scripted
    engine.scripts = ["first", "second", "third"]
    handle = capture.open()
    client, before = _client(handle), len(recording.calls)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for text in ("one", "two", "three"):
        reply = client.chat.completions.create(model=handle.model, messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": text}]  # fmt: skip
        if text == "one":  # a context manager summarizes: the history is rewritten
            messages = [{"role": "user", "content": "Summary: started, said first."}, messages[-1]]
    traj = capture.close(handle.id)
    assert len(traj.samples) == 2 and traj.env_metrics["capture_forks"] == 1
    assert [len(s.turn_spans) for s in traj.samples] == [1, 2]
    check_against_engine(traj, recording, slice(before, None))


def test_sdk_retry_replaces_its_turn(scripted: Any) -> None:
    """The first attempt outlives the client's timeout and is sampled anyway; the SDK's retry (same body,
    x-stainless-retry-count 1) replaces it: one sample, one turn per reply the harness got."""
    capture, recording, engine, _ = scripted
    engine.scripts = ["slow", "answer", "done"]
    handle = capture.open()
    client, before = _client(handle, max_retries=2, timeout=1.0), len(recording.calls)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    engine.delay = 1.6
    reply = client.chat.completions.create(model=handle.model, messages=messages)
    assert reply.choices[0].message.content == "answer"
    messages += [{"role": "assistant", "content": "answer"}, {"role": "user", "content": "Again."}]
    assert client.chat.completions.create(model=handle.model, messages=messages).choices[0].message.content == "done"
    traj = capture.close(handle.id)
    assert len(recording.calls) - before == 3  # the timed-out attempt, its retry, the next turn
    assert traj.continuations == [] and traj.num_turns == 2 and traj.env_metrics["capture_retries"] == 1
    check_against_engine(traj, recording, slice(before + 1, None))


def test_episode_key_works_on_the_plain_routes(scripted: Any) -> None:
    capture, _, engine, url = scripted
    engine.scripts = ["hello"]
    handle = capture.open()
    plain = openai.OpenAI(base_url=url + "/v1", api_key=handle.api_key, max_retries=0)
    assert plain.chat.completions.create(model="any-name", messages=[{"role": "user", "content": "hi"}]).choices[
        0].message.content == "hello"  # fmt: skip
    assert plain.responses.create(model="x", input="hi", instructions="Hi.").output_text == "hello"
    traj = capture.close(handle.id)
    assert traj.num_turns == 2 and len(traj.samples) == 2  # the Responses turn has a system prompt: another sample
    with pytest.raises(openai.AuthenticationError):  # a closed episode's key is no key at all
        plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def test_budgets_answer_400_then_the_episode_is_gone(scripted: Any) -> None:
    capture, _, engine, _ = scripted
    engine.scripts = ["ok"]
    handle = capture.open(EpisodeLimits(max_turns=1))
    client = _client(handle)
    ask = lambda: client.chat.completions.create(model=handle.model, messages=[{"role": "user", "content": "a"}])  # noqa: E731
    ask()
    with pytest.raises(openai.BadRequestError, match="turn budget"):
        ask()
    with pytest.raises(openai.NotFoundError, match="finished"):
        ask()
    traj = capture.close(handle.id)
    assert traj.stop_reason == "max_turns" and traj.num_turns == 1
    tokens = capture.open(EpisodeLimits(max_tokens=2))
    reply = _client(tokens).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError, match="token budget"):
        _client(tokens).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])
    assert capture.close(tokens.id).stop_reason == "length"
    context = _client(capture.open())
    reply = context.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}], max_tokens=10**6)
    assert reply.choices[0].finish_reason == "stop"  # a limit past the context's room is cut to it
    with pytest.raises(openai.BadRequestError, match="outgrew the context"):
        context.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long " * 600}])
    with pytest.raises(openai.NotFoundError):
        context.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])


BAD_BODIES = [
    ("chat/completions", b"{not json", "not valid JSON"),
    ("chat/completions", b"[1, 2]", "JSON object"),
    ("chat/completions", json.dumps({"model": MODEL}).encode(), "messages"),
    ("chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}).encode(),
     "messages.0.role"),
    ("chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                     "temperature": "hot"}).encode(), "temperature"),
    ("chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
     "n=1"),
    ("responses", json.dumps({"model": MODEL, "input": [{"type": "input_image", "image_url": "x"}]}).encode(),
     "input_image"),
    ("responses", json.dumps({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}).encode(), "tools"),
    ("responses", json.dumps({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}).encode(),
     "resp_nope"),
    ("responses", json.dumps({"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                          "arguments": "[1]"}]}).encode(), "JSON object"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "says"), BAD_BODIES)
def test_malformed_bodies_get_a_4xx_and_leave_the_episode_usable(scripted: Any, route: str, body: bytes,
                                                                 says: str) -> None:  # fmt: skip
    capture, _, engine, _ = scripted
    engine.scripts = ["fine"]
    handle = capture.open()
    bad = http.post(f"{handle.base_url}/{route}", content=body, headers={"content-type": "application/json"})
    assert bad.status_code == 400 and says in bad.json()["error"]["message"] + str(bad.json()["error"]["param"])
    ok = http.post(f"{handle.base_url}/chat/completions", json={"model": MODEL, "unknown_field": {"x": 1},
                   "messages": [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}]})  # fmt: skip
    assert ok.status_code == 200, ok.text
    assert capture.close(handle.id).num_turns == 1


def test_unknown_and_closed_episodes_are_404(scripted: Any) -> None:
    capture, _, engine, url = scripted
    engine.scripts = ["fine"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    for route in ("chat/completions", "completions", "responses"):
        missing = http.post(f"{url}/episodes/nope/v1/{route}", json=body)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "episode_not_found"
    assert http.post(f"{url}/episodes/nope/reward", json={"reward": 1}).status_code == 404
    handle = capture.open()
    assert http.post(handle.reward_url, json={"reward": "lots"}).status_code == 400
    capture.close(handle.id)
    assert http.post(f"{handle.base_url}/chat/completions", json=body).status_code == 404
    assert http.post(handle.reward_url, json={"reward": 1}).status_code == 404
    assert http.get(f"{handle.base_url}/models").status_code == 404


def test_completions_extend_the_sample_by_their_own_tokens(real: Any) -> None:
    capture, recording, _ = real
    handle = capture.open()
    client, before = _client(handle), len(recording.calls)
    first = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, seed=1)
    ids = recording.calls[-1][0] + recording.calls[-1][1].token_ids
    client.completions.create(model=MODEL, prompt=[*ids, *capture.chat.encode(" then")], max_tokens=4, seed=2)
    assert first.choices[0].text is not None
    traj = capture.close(handle.id)
    assert traj.continuations == [] and traj.num_turns == 2
    check_against_engine(traj, recording, slice(before, None))


def test_capture_over_a_remote_engine_records_what_that_server_sampled(real: Any) -> None:
    """The capture talks to the engine interface only: here a RemoteEngine over another OpenAI-compatible server
    (the real engine's, on loopback), served by `serve_capture` in its own event loop."""
    from thermik.capture import serve_capture
    from thermik.inference.remote import RemoteEngine

    capture, recording, url = real
    before = len(recording.calls)

    async def play() -> Trajectory:
        remote = RemoteEngine(url, model=MODEL, stop_token_ids=capture.chat.stop_ids)
        async with serve_capture(remote, capture.chat.tokenizer, "remote-policy", max_model_len=512) as remote_capture:
            handle = remote_capture.open()
            client = openai.AsyncOpenAI(base_url=handle.base_url, api_key=handle.api_key, max_retries=0)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
            for _ in range(2):
                reply = await client.chat.completions.create(model=handle.model, messages=messages, max_tokens=5)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                             {"role": "user", "content": "More."}]  # fmt: skip
            await client.close()
            traj = remote_capture.close(handle.id)
        await remote.close()
        return traj

    traj = asyncio.run(play())
    assert traj.num_turns == 2 and traj.continuations == []
    check_against_engine(traj, recording, slice(before, None))


def test_token_in_generate_by_episode_key_extends_then_forks(real: Any) -> None:
    """vLLM's /inference/v1/generate (verifiers' training client) with an episode key: prompts that extend the
    sample's tokens continue it, one that does not starts another."""
    capture, recording, url = real
    handle = capture.open()
    before = len(recording.calls)
    auth = {"Authorization": f"Bearer {handle.api_key}"}
    prompt = capture.chat.encode_prompt([{"role": "user", "content": "Hi"}])

    def ask(ids: list[int]) -> list[int]:
        reply = http.post(f"{url}/inference/v1/generate", headers=auth, json={
            "model": "any", "token_ids": ids, "sampling_params": {"max_tokens": 4, "seed": 1}})  # fmt: skip
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    first = ask(prompt)
    ask([*prompt, *first, *capture.chat.encode_observations([{"role": "user", "content": "More."}])])
    ask(capture.chat.encode_prompt([{"role": "user", "content": "Other."}]))
    traj = capture.close(handle.id)
    assert [len(s.turn_spans) for s in traj.samples] == [2, 1]
    check_against_engine(traj, recording, slice(before, None))


def test_real_engine_responses_stream_as_sampled(real: Any) -> None:
    """Text deltas come as the engine samples (several of them) and add up to the final text; the recorded tokens
    are the engine's."""
    capture, recording, _ = real
    handle = capture.open()
    before = len(recording.calls)
    client = _client(handle)
    events = list(client.responses.create(model=handle.model, input="Tell me a story.", max_output_tokens=12,
                                          stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert kinds[-1] == "response.incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert kinds[:4] == TEXT_EVENTS[:4] and kinds[-4:-1] == TEXT_EVENTS[-4:-1] and len(deltas) > 1
    assert "".join(deltas) == final.output[0].content[0].text
    again = client.responses.create(model=handle.model, input=[{"role": "user", "content": "More."}],
                                    previous_response_id=final.id, max_output_tokens=5)  # fmt: skip
    assert again.status in ("completed", "incomplete")
    traj = capture.close(handle.id)
    assert traj.num_turns == 2 and traj.continuations == []
    check_against_engine(traj, recording, slice(before, None))

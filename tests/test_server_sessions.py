"""Session ids over HTTP: a multi-turn episode through `RemoteEngine` and a real loopback `thermik inference` app
keeps its cached prefix between turns (the embedded engine prefills only each turn's new tokens), while the same
episode without session ids, with other traffic between turns, prefills every turn in full."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from serving import running

from thermik.inference.base import SamplingParams
from thermik.inference.remote import RemoteEngine
from thermik.inference.server.app import build_app
from thermik.inference.server.run import load_engine

MODEL = "tiny"
TURNS = 3


async def _episode(remote: RemoteEngine, first: list[int], other: list[int], engine) -> list[tuple[int, int]]:
    """TURNS turns of one episode (each prompt = the previous prompt + its reply + an observation), with an
    unrelated request after every turn; (prompt length, tokens the engine prefilled for it) per turn."""
    prompt, observation, out = list(first), [7, 8, 9], []
    sampling = SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    for turn in range(TURNS):
        before = engine.num_prefill_tokens
        gen = await remote.generate(prompt, sampling, session_id="episode-1")
        out.append((len(prompt), engine.num_prefill_tokens - before))
        await remote.generate(other, SamplingParams(max_tokens=4, seed=turn))  # takes any free cache slot
        prompt = prompt + gen.token_ids + observation
    await remote.close()
    return out


def _run_episode(model_dir: Path, send_session_ids: bool | None) -> tuple[list[tuple[int, int]], bool | None]:
    # max_batch_size=1: at most two cache slots, so the unrelated request reuses the episode's slot unless the
    # session keeps it parked
    engine, tokenizer = load_engine(model_dir, max_batch_size=1)
    first = tokenizer.encode("user: reverse the word thermik, please", add_special_tokens=False)
    other = tokenizer.encode("0 1 2 3", add_special_tokens=False)
    assert first[0] != other[0]  # no shared prefix: the unrelated request cannot donate cached tokens
    with running(build_app(engine, tokenizer, MODEL), on_exit=engine.close) as url:
        remote = RemoteEngine(url, send_session_ids=send_session_ids)
        turns = asyncio.run(_episode(remote, first, other, engine))
        return turns, remote.send_session_ids


def test_session_ids_over_http_prefill_only_each_turns_new_tokens(tiny_model_dir: Path) -> None:
    with_sessions, detected = _run_episode(tiny_model_dir, send_session_ids=None)
    without, _ = _run_episode(tiny_model_dir, send_session_ids=False)
    assert detected is True  # auto-detected: the server's model card is owned by thermik
    # without session ids the other request took the slot: every turn is prefilled in full
    assert [prefilled for _, prefilled in without] == [length for length, _ in without]
    # with them turn 1 is prefilled in full, later turns only past what the parked slot holds (reply + observation)
    assert with_sessions[0][1] == with_sessions[0][0]
    for (length, prefilled), (previous, _) in zip(with_sessions[1:], with_sessions, strict=False):
        assert prefilled <= length - previous, (length, previous, prefilled)
    assert sum(p for _, p in with_sessions) < sum(p for _, p in without)


def test_session_id_needs_one_prompt_and_n_1(tiny_model_dir: Path) -> None:
    engine, tokenizer = load_engine(tiny_model_dir)
    with running(build_app(engine, tokenizer, MODEL), on_exit=engine.close) as url:
        base = {"model": MODEL, "max_tokens": 2, "session_id": "s"}
        ok = httpx.post(f"{url}/v1/completions", json={**base, "prompt": [5, 6]}, timeout=60)
        assert ok.status_code == 200, ok.text
        for extra in ({"prompt": [5, 6], "n": 2}, {"prompt": [[5, 6], [7, 8]]}):
            resp = httpx.post(f"{url}/v1/completions", json={**base, **extra}, timeout=60)
            assert resp.status_code == 400
            assert resp.json()["error"]["param"] == "session_id"
        empty = httpx.post(f"{url}/v1/completions", json={**base, "prompt": [5], "session_id": ""}, timeout=60)
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "session_id"

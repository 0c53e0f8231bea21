"""Data generators: rule-based rows per environment, LLM-written rows through a real OpenAI-compatible HTTP
server on loopback (the real openai client), and dependent-spec conversations converted to compact rows."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from thermik.cli import main
from thermik.config.schema import LLMGeneratorConfig
from thermik.data.convert import compact_row, convert_conversations
from thermik.data.dataset import DatasetError, load_rows, read_jsonl, validate_row
from thermik.data.llm_generate import Rejected, parse_reply
from thermik.data.split import split_of
from thermik.tasks.registry import generate_rows, llm_generate_rows, solve
from thermik.tools.parsers import format_hermes_tool_call

NEW_ENVS = ("gsm8k", "math_feedback", "text2sql", "search", "code", "calculator_thinking")


# ---------------------------------------------------------------- rule-based


@pytest.mark.parametrize("env", NEW_ENVS)
def test_rule_based_rows_are_valid_deterministic_and_split_disjoint(env):
    train = generate_rows(env, 20, seed=5, split="train")
    assert train == generate_rows(env, 20, seed=5, split="train")
    assert train != generate_rows(env, 20, seed=6, split="train")
    evals = generate_rows(env, 5, seed=5, split="eval")
    prompts = lambda rows: {r["prompt"][-1]["content"] for r in rows}  # noqa: E731
    assert len(prompts(train)) == 20 and not prompts(train) & prompts(evals)
    for row in train + evals:
        validate_row(row)
        assert row["env_class"] == env and json.loads(json.dumps(row)) == row
        assert solve(row)[: len(row["prompt"])] == row["prompt"] and solve(row)[-1]["role"] == "assistant"


def test_text2sql_says_how_many_problems_it_has():
    with pytest.raises(ValueError, match=r"could only find \d+ distinct train problems for 'text2sql'"):
        generate_rows("text2sql", 300, seed=0)


# ---------------------------------------------------------------- LLM generator against a real HTTP server


def _stub_app(requests: list[dict[str, Any]]):
    """/v1/chat/completions answering deterministically from the request's seed: every fourth reply is unusable."""
    from fastapi import FastAPI, Header, HTTPException

    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any], authorization: str = Header("")) -> dict[str, Any]:
        if authorization != "Bearer sk-test":
            raise HTTPException(status_code=401, detail="bad key")
        requests.append(body)
        k = int(body["seed"]) % 1000
        if body["messages"][-1]["content"].startswith("Write a question about the shop"):
            content = json.dumps({"question": f"How many customers have id below {k + 2}?",
                                  "sql": f"SELECT COUNT(*) FROM customers WHERE id < {k + 2}"})  # fmt: skip
        elif k % 4 == 3:
            content = "Sorry, I cannot help with that."
        else:
            content = "```json\n" + json.dumps({
                "question": f"Tom has {k} pens and buys {k + 1} more. How many pens does he have?",
                "solution": f"{k} + {k + 1} = {2 * k + 1}.", "answer": 2 * k + 1,
            }) + "\n```"  # fmt: skip
        return {
            "id": f"chatcmpl-{k}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }  # fmt: skip

    return app


@pytest.fixture(scope="module")
def llm_stub() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    import uvicorn

    requests: list[dict[str, Any]] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_stub_app(requests), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", requests
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")
    return "TEST_LLM_KEY"


def test_llm_rows_are_checked_split_and_solvable(llm_stub, api_key):
    url, requests = llm_stub
    requests.clear()
    cfg = LLMGeneratorConfig(base_url=url, model="stub-model", api_key_env=api_key, concurrency=3)
    rows = llm_generate_rows("gsm8k", 6, cfg, seed=1)
    assert len(rows) == 6 and len({r["prompt"][-1]["content"] for r in rows}) == 6
    for row in rows:
        assert split_of(row["prompt"][-1]["content"]) == "train"
        k = int(row["prompt"][-1]["content"].split()[2])
        assert row["reward_spec"]["ground_truth"] == str(2 * k + 1)
        assert solve(row)[-1]["content"].endswith(f"#### {2 * k + 1}")
    assert all(r["model"] == "stub-model" for r in requests)
    assert len(requests) > 6  # unusable replies (and eval-split problems) were asked again, not kept
    assert "Examples:" in requests[0]["messages"][-1]["content"]  # rule-generated few-shot examples


def test_llm_sql_rows_are_validated_on_the_database(llm_stub, api_key):
    url, _ = llm_stub
    rows = llm_generate_rows("text2sql", 2, LLMGeneratorConfig(base_url=url, model="m", api_key_env=api_key), seed=2)
    assert all(r["reward_spec"]["ground_truth"].startswith("SELECT COUNT(*) FROM customers") for r in rows)


def test_llm_generation_fails_clearly(llm_stub, monkeypatch):
    url, _ = llm_stub
    monkeypatch.setenv("TEST_LLM_KEY", "wrong")
    cfg = LLMGeneratorConfig(base_url=url, model="m", api_key_env="TEST_LLM_KEY", max_requests_per_row=1)
    with pytest.raises(ValueError, match=r"only 0 of 2 rows after \d+ requests .*request failed: AuthenticationError"):
        llm_generate_rows("gsm8k", 2, cfg)
    with pytest.raises(ValueError, match="no LLM generator for environment 'code'"):
        llm_generate_rows("code", 1, cfg)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [("no json here", "no JSON object"), ("{broken", "invalid JSON"), ("[1, 2]", "no JSON object")],
)
def test_parse_reply_rejections(reply, reason):
    with pytest.raises(Rejected, match=reason):
        parse_reply(reply)


def test_cli_synthesize_with_an_llm(llm_stub, api_key, tmp_path):
    url, _ = llm_stub
    argv = ["synthesize", "--env", "gsm8k", "--n", "3", "--out", str(tmp_path), "--llm-base-url", url,
            "--llm-model", "m", "--llm-api-key-env", api_key]  # fmt: skip
    assert main(argv) == 0
    rows = load_rows(tmp_path / "rows.jsonl")
    sft = read_jsonl(tmp_path / "sft.jsonl")
    assert len(rows) == 3 and [s["messages"][:2] for s in sft] == [r["prompt"] for r in rows]


# ---------------------------------------------------------------- dependent-spec conversations


def _dependent_conversation() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You book travel."},
            {"role": "user", "content": "Find flights from Lisbon to Oslo on May 3."},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "search_flights", "arguments": json.dumps({"from": "LIS", "to": "OSL", "date": "05-03"})}}]},
            {"role": "tool", "content": "TP123 210 EUR; SK456 180 EUR"},
            {"role": "user", "content": "Book the cheaper one."},
            {"role": "assistant", "content": format_hermes_tool_call("book", {"flight": "SK456"})},
            {"role": "tool", "content": "booked: ref Q7"},
            {"role": "user", "content": "Thanks, what is my reference?"},
            {"role": "assistant", "content": "<answer>Q7</answer>"},
        ],
        "tools": [{"type": "function", "function": {"name": "book"}}],
    }  # fmt: skip


def test_dependent_conversation_becomes_a_compact_row():
    row = compact_row(_dependent_conversation(), "x")
    validate_row(row)
    assert row["env_class"] == "mcp"
    assert row["prompt"] == [
        {"role": "system", "content": "You book travel."},
        {"role": "user", "content": "Find flights from Lisbon to Oslo on May 3."},
    ]
    assert row["reward_spec"]["ground_truth"] == {
        "must_call_tool": True,
        "tool_sequence": [
            {"tool": "search_flights", "parameters": {"from": "LIS", "to": "OSL", "date": "05-03"}},
            {"tool": "book", "parameters": {"flight": "SK456"}},
        ],
        "answer": "Q7",
    }
    assert row["extra_info"]["num_user_turns"] == 3 and row["extra_info"]["tools"][0]["function"]["name"] == "book"


@pytest.mark.parametrize(
    ("conversation", "fragment"),
    [
        ([{"role": "assistant", "content": "hi"}], "no user message"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "no tool call"),
        ({"messages": "nope"}, "expected {'messages'"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<tool_call>{bad</tool_call>"}],
         "message 1: unreadable <tool_call>"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f",
          "arguments": "{bad"}}]}], "arguments is not valid JSON"),
    ],
)  # fmt: skip
def test_converter_names_what_is_wrong(conversation, fragment):
    with pytest.raises(DatasetError, match=fragment.replace("{", r"\{").replace("[", r"\[")):
        compact_row(conversation, "conv.jsonl conversation 4")


def test_cli_converts_a_conversation_file(tmp_path: Path):
    source = tmp_path / "conversations.jsonl"
    source.write_text(json.dumps(_dependent_conversation()) + "\n" + json.dumps(_dependent_conversation()["messages"]))
    assert main(["synthesize", "--from-conversations", str(source), "--out", str(tmp_path / "out")]) == 0
    rows = load_rows(tmp_path / "out" / "rows.jsonl")
    assert rows == convert_conversations(source) and len(rows) == 2

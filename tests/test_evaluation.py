"""The evaluation harness: pass@k against hand values and a brute-force count, failure categories of real calculator
episodes (real MCP server) with a scripted policy, skipped over-long rows, and `thermik eval` end to end."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from math import comb
from pathlib import Path

import pytest
from conftest import run_thermik

from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.data.dataset import write_rows
from thermik.inference.base import Generation, SamplingParams
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import engine_player, evaluate, pass_at_k
from thermik.rollout.failures import classify
from thermik.rollout.tokenization import ChatTokenizer
from thermik.tasks.registry import generate_rows, solve
from thermik.tools.mcp_pool import MCPPool
from thermik.training.components import env_factory


@pytest.mark.parametrize(
    ("n", "c", "k", "want"),
    [(5, 0, 1, 0.0), (5, 5, 3, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (8, 2, 8, 1.0), (10, 3, 5, 1 - 21 / 252)],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, want: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(want)


def test_pass_at_k_equals_the_fraction_of_k_subsets_holding_a_success() -> None:
    for n, c, k in [(6, 2, 3), (7, 1, 4), (9, 4, 2)]:
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / comb(n, k))
    with pytest.raises(ValueError, match="needs at least 4 samples"):
        pass_at_k(3, 1, 4)


def test_classify_names_each_category() -> None:
    prompt = [{"role": "user", "content": "q"}]
    tool_err = {"role": "tool", "content": "error: division by zero"}
    cases = {
        "malformed_tool_call": ([{"role": "assistant", "content": "<tool_call>{bad</tool_call>"}], "stop"),
        "unknown_tool_or_bad_arguments": (
            [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "error: unknown tool 'x'"}],
            "stop",
        ),
        "tool_error": ([{"role": "assistant", "content": "x"}, tool_err], "stop"),
        "context_overflow": ([{"role": "assistant", "content": "aaaa"}], "length"),
        "turn_limit": ([{"role": "assistant", "content": "a"}], "max_turns"),
        "no_final_answer": ([{"role": "assistant", "content": "<think>hm</think>  "}], "stop"),
        "wrong_answer": ([{"role": "assistant", "content": "<answer>3</answer>"}], "stop"),
    }
    for want, (turns, stop) in cases.items():
        assert classify(prompt + turns, stop, 0.0, 1) == want
    assert classify([*prompt, tool_err], "stop", 1.0, 1) is None  # solved: no category


class ProblemScripts:
    """A policy that plays, per problem, a queue of episode scripts (one assistant text per turn); episodes are told
    apart by session id, problems by the user question in the prompt."""

    def __init__(self, chat: ChatTokenizer, scripts: dict[str, list[list[str]]]) -> None:
        self.chat, self.scripts, self.sessions = chat, scripts, {}
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None):
        if session_id not in self.sessions:
            text = self.chat.tokenizer.decode(prompt_ids)
            question = next(q for q in self.scripts if q in text)
            self.sessions[session_id] = list(self.scripts[question].pop(0))
        ids = [*self.chat.encode(self.sessions[session_id].pop(0)), self.chat.eos_id]
        return Generation(ids, [-0.5] * len(ids), "stop", 0, [0] * len(ids))


def scripted_calculator_eval(chat: ChatTokenizer, scripts: dict, rows: list[dict], k: int):
    """The evaluation path over calculator envs (real MCP server) with a `ProblemScripts` policy."""
    limits = LoopLimits(max_turns=3, max_input_length=512, max_generate_length=96, max_sequence_length=1024)

    async def go():
        pool = MCPPool()
        try:
            make = env_factory(EnvConfig(name="calculator"), pool)
            play = engine_player(ProblemScripts(chat, scripts), make, chat, limits, SamplingConfig())
            return await evaluate(play, rows, k=k, chat=chat, env_name="calculator")
        finally:
            await pool.aclose()

    return asyncio.run(go())


def test_evaluate_scores_failures_and_skips_with_real_calculator_episodes() -> None:
    chat = ChatTokenizer(build_tokenizer())
    rows = generate_rows("calculator", 3, seed=5, split="eval")
    good = [[m["content"] for m in solve(r) if m["role"] == "assistant"] for r in rows]
    call = good[2][0]  # a well-formed calculator call
    scripts = {
        rows[0]["prompt"][-1]["content"]: [good[0]] * 4,
        rows[1]["prompt"][-1]["content"]: [good[1]] + [["<answer>-99999</answer>"]] * 3,
        rows[2]["prompt"][-1]["content"]: [
            ["<tool_call>{not json</tool_call>", "<answer>1</answer>"],
            ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<answer>1</answer>"],
            [""],
            [call, call, call],
        ],
    }
    too_long = {**rows[0], "prompt": [{"role": "user", "content": "word " * 2000}]}
    result, records = scripted_calculator_eval(chat, scripts, [*rows, too_long], k=4)
    b = result.breakdown
    assert (result.n, result.problems, result.skipped) == (12, 3, 1)
    assert b["pass@1"] == pytest.approx((1 + 0.25 + 0) / 3) and b["pass@4"] == pytest.approx(2 / 3)
    assert b["avg@4"] == pytest.approx(5 / 12) and b["env/calculator/pass@4"] == pytest.approx(2 / 3)
    want = {"wrong_answer": 3, "malformed_tool_call": 1, "unknown_tool_or_bad_arguments": 1}
    want |= {"no_final_answer": 1, "turn_limit": 1, "tool_error": 0, "context_overflow": 0}
    assert {k.removeprefix("failures/"): v for k, v in b.items() if k.startswith("failures/")} == want
    r = records[0]
    assert {"input_prompt", "output_response", "score", "stop_reason", "env_extras", "failure"} <= set(r)
    assert r["turn_tokens"][0]["logprobs"][0] == -0.5 and "".join(r["turn_tokens"][0]["tokens"]).startswith("<tool")


def _mixed_rows(path: Path) -> list[dict]:
    calc = generate_rows("calculator", 2, seed=1, split="eval")
    rev = [{**r, "data_source": "mine/reverse"} for r in generate_rows("reverse_text", 2, seed=1, split="eval")]
    long = {**rev[0], "prompt": [{"role": "user", "content": "reverse this " * 400}]}
    write_rows(path, [*calc, *rev, long])
    return calc + rev


def test_thermik_eval_k8_mixed_envs_writes_8n_records(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = _mixed_rows(tmp_path / "rows.jsonl")
    out = run_thermik(
        "eval", "--k", "8", "--model.path", str(tiny_model_dir), "--env.name", "", "--env.max_turns", "2",
        "--data.eval_path", str(tmp_path / "rows.jsonl"), "--rollout.max_generate_length", "8",
        "--rollout.max_input_length", "400", "--output_dir", str(tmp_path / "runs"), "--name", "ev", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for text in ("pass@1", "pass@8", "avg@8", "env/calculator", "env/reverse_text", "source/mine/reverse", "1 skipped"):
        assert text in out.stdout, out.stdout
    run = tmp_path / "runs" / "ev"
    lines = [json.loads(x) for x in (run / "trajectories" / "eval.jsonl").read_text().splitlines()]
    assert len(lines) == 8 * len(rows)
    assert {(x["problem"], x["sample"]) for x in lines} == {(p, s) for p in range(len(rows)) for s in range(8)}
    agg = [json.loads(x) for x in (run / "aggregated_results.jsonl").read_text().splitlines()]
    assert agg[0]["k"] == 8 and agg[0]["skipped"] == 1 and agg[0]["n"] == 8 * len(rows)


def test_thermik_eval_with_only_eval_path_and_the_mcp_env(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Issue 18, defect 5: no training set is built, so no generator for `mcp` is needed."""
    rows = [{**r, "env_class": "mcp", "extra_info": {}} for r in generate_rows("calculator", 2, seed=2, split="eval")]
    write_rows(tmp_path / "rows.jsonl", rows)
    server = f"calculator={sys.executable} -m thermik.tasks.calculator.server"
    out = run_thermik(
        "eval", "--model.path", str(tiny_model_dir), "--env.name", "mcp", "--env.mcp_servers", json.dumps([server]),
        "--data.eval_path", str(tmp_path / "rows.jsonl"), "--rollout.max_generate_length", "8",
        "--output_dir", str(tmp_path / "runs"), "--name", "mcp", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "runs" / "mcp" / "eval.json").read_text())["n"] == 2

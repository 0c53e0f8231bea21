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
import torch
from conftest import run_thermik

from thermik.assembly.components import env_factory
from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.data.dataset import write_rows
from thermik.inference.base import Generation, SamplingParams
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.evaluation import EvalResult, engine_player, evaluate, pass_at_k, summarize
from thermik.rollout.failures import classify
from thermik.tasks.registry import generate_rows, solve
from thermik.tools.mcp_pool import MCPPool


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


def test_success_standard_error_is_binomial_over_problems() -> None:
    records = [
        {
            "problem": i,
            "score": float(i % 4 == 0),
            "num_turns": 1,
            "failure": None,
            "env_class": "e",
            "data_source": "d",
        }
        for i in range(200)
    ]
    result = summarize(records, k=1)
    assert result.success == 0.25 and result.problems == 200
    assert result.success_se == pytest.approx((0.25 * 0.75 / 200) ** 0.5)
    # k samples per problem: the problems, not the samples, are the unit (a conservative standard error)
    assert EvalResult(success=0.5, reward=0.5, turns=1.0, n=800, k=4, problems=200).success_se == pytest.approx(
        (0.25 / 200) ** 0.5
    )
    assert EvalResult(success=1.0, reward=1.0, turns=1.0, n=0).success_se == 0.0


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
    want |= {"no_final_answer": 1, "turn_limit": 1, "tool_error": 0, "context_overflow": 0, "agent_failed": 0}
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_thermik_eval_with_only_eval_path_and_the_mcp_env(tiny_model_dir: Path, tmp_path: Path) -> None:
    """No training set is built, so no generator for `mcp` is needed."""
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


def _eval_args(model: Path, rows: Path, out: Path, name: str) -> list[str]:
    return [
        "eval", "--model.path", str(model), "--env.name", "calculator", "--env.max_turns", "2",
        "--data.eval_path", str(rows), "--rollout.max_generate_length", "12", "--eval.temperature", "0",
        "--output_dir", str(out), "--name", name,
    ]  # fmt: skip


def _responses(run: Path) -> list[tuple[int, str, float]]:
    lines = [json.loads(x) for x in (run / "trajectories" / "eval.jsonl").read_text().splitlines()]
    return [(x["problem"], x["output_response"], x["score"]) for x in lines]


@pytest.mark.slow
def test_api_policy_against_thermik_inference_matches_in_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same checkpoint, greedy: in this process's engine, and through `thermik inference`'s chat API with the
    calculator's tools; the same episodes (text and reward) come back."""
    from serving import start_thermik_inference

    write_rows(tmp_path / "rows.jsonl", generate_rows("calculator", 6, seed=3, split="eval"))
    local = run_thermik(*_eval_args(tiny_model_dir, tmp_path / "rows.jsonl", tmp_path / "runs", "local"), timeout=300)
    assert local.returncode == 0, local.stderr[-3000:]
    server, url = start_thermik_inference(
        tmp_path / "server.log", "--model.path", str(tiny_model_dir), "--server.port", "0"
    )
    try:
        args = _eval_args(Path("/nonexistent"), tmp_path / "rows.jsonl", tmp_path / "runs", "api")
        api = run_thermik(*args, "--policy.base_url", f"{url}/v1", timeout=300)
        assert api.returncode == 0, api.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    a, b = _responses(tmp_path / "runs" / "local"), _responses(tmp_path / "runs" / "api")
    assert len(a) == len(b) == 6 and all(text for _, text, _ in a)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    assert same >= 5, list(zip(a, b, strict=True))  # greedy: identical but for a rare near-tie in float rounding
    summary = json.loads((tmp_path / "runs" / "api" / "eval.json").read_text())
    assert summary["success"] == json.loads((tmp_path / "runs" / "local" / "eval.json").read_text())["success"]


def _texts(run: Path, name: str) -> list[str]:
    return [json.loads(x)["output_response"] for x in (run / "trajectories" / f"{name}.jsonl").open()]


@pytest.mark.slow
def test_eval_steps_over_a_finished_runs_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Checkpoints 2 and 4 of a real run, plus a step 6 saved by the checkpoint writer from another model: the table,
    the plot, and step 6 answering exactly as that model does (so each checkpoint's weights are the ones sampled)."""
    from thermik.models.loading import load_model
    from thermik.models.presets import init_model
    from thermik.training.checkpoint import save_training_state

    write_rows(tmp_path / "train.jsonl", generate_rows("reverse_text", 32, 0, split="train"))
    write_rows(tmp_path / "eval.jsonl", generate_rows("reverse_text", 3, 0, split="eval"))
    common = [
        "--env.name", "reverse_text", "--env.max_turns", "1", "--data.eval_path", str(tmp_path / "eval.jsonl"),
        "--rollout.max_generate_length", "8", "--eval.temperature", "0", "--output_dir", str(tmp_path / "runs"),
    ]  # fmt: skip
    train = run_thermik(
        "rl", "--model.path", str(tiny_model_dir), *common, "--data.train_path", str(tmp_path / "train.jsonl"),
        "--trainer.steps", "4", "--trainer.prompts_per_step", "2", "--trainer.group_size", "4",
        "--checkpoint.every", "2", "--checkpoint.keep", "3", "--eval.before", "false", "--eval.size", "3",
        "--monitor.progress", "false", "--name", "trained", timeout=300,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    other = init_model("qwen2-1m", tmp_path / "other", seed=1)
    model = load_model(str(other))
    save_training_state(
        tmp_path / "runs" / "trained" / "checkpoints" / "step_6", model, torch.optim.SGD(model.parameters()), 6
    )
    out = run_thermik(
        "eval", "--model.path", str(tiny_model_dir), *common, "--steps", "all",
        "--checkpoints_of", str(tmp_path / "runs" / "trained"), "--name", "steps", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "steps"
    table = (run / "eval_steps.md").read_text().splitlines()
    assert table[0].startswith("| step | success") and [r.split("|")[1].strip() for r in table[2:]] == ["2", "4", "6"]
    assert (run / "eval_steps.csv").read_text().splitlines()[1].startswith("2,")
    assert (run / "plots" / "eval_vs_step.png").stat().st_size > 1000
    agg = [json.loads(x) for x in (run / "aggregated_results.jsonl").read_text().splitlines()]
    assert [a["step"] for a in agg] == [2, 4, 6] and all(a["n"] == 3 for a in agg)
    direct = run_thermik("eval", "--model.path", str(other), *common, "--name", "other", timeout=300)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert _texts(run, "eval_step_6") == _texts(tmp_path / "runs" / "other", "eval")
    assert _texts(run, "eval_step_6") != _texts(run, "eval_step_4")


class SolvingEngine:
    """Behind thermik's chat server: answers a calculator question with the solver's tool call, and once the prompt
    holds the tool's result, with the solver's answer."""

    def __init__(self, tokenizer, rows: list[dict]) -> None:
        self.tokenizer, self.weight_version = tokenizer, 0
        self.turns = {
            r["prompt"][-1]["content"]: [m["content"] for m in solve(r) if m["role"] == "assistant"] for r in rows
        }

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None):
        prompt = self.tokenizer.decode(prompt_ids)
        question = next(q for q in self.turns if q in prompt)
        text = self.turns[question][1 if "<tool_response>" in prompt else 0]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "stop", 0, [0] * len(ids))

    async def close(self) -> None:
        return None


def test_api_policy_plays_tool_calls_through_the_chat_api(tiny_model_dir: Path) -> None:
    """The chat API's tool_calls go back to the env in its format, tool results come back as tool messages with the
    call's id: solved calculator episodes through thermik's server and the openai SDK."""
    from serving import running

    from thermik.config.schema import PolicyConfig
    from thermik.inference.server.app import build_app
    from thermik.models.loading import load_tokenizer
    from thermik.rollout.api_policy import ApiPolicy

    tokenizer = load_tokenizer(str(tiny_model_dir))
    rows = generate_rows("calculator", 2, seed=7, split="eval")
    limits = LoopLimits(max_turns=3, max_input_length=512, max_generate_length=96, max_sequence_length=1024)

    async def go(url: str):
        pool = MCPPool()
        policy = PolicyConfig(base_url=url + "/v1")
        player = ApiPolicy(policy, env_factory(EnvConfig(name="calculator"), pool), limits, SamplingConfig(), "hermes")
        try:
            return await evaluate(player, rows, k=2, env_name="calculator")
        finally:
            await player.close()
            await pool.aclose()

    with running(build_app(SolvingEngine(tokenizer, rows), tokenizer, "scripted")) as url:
        result, records = asyncio.run(go(url))
    assert (result.success, result.n) == (1.0, 4)
    for r in records:
        assert r["tool_calls"] == 1.0 and r["tool_failures"] == 0.0 and r["num_turns"] == 2 and r["failure"] is None
        assert '"name": "calculate"' in r["messages"][-3]["content"] and r["messages"][-2]["role"] == "tool"

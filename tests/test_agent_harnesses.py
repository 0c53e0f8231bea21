"""Real agent harnesses (`[agent]`) playing episodes through the capture endpoint of a tiny model's engine.

In the harness venv (scripts/harness_venv.sh): the openai SDK tool loop (chat, streamed and not), openai-agents with
OpenAIChatCompletionsModel and OpenAIResponsesModel (streamed and not), LangGraph via langchain-openai (chat and
`use_responses_api=True`): each episode's recorded tokens are the engine's own sampled ids; and each runs `thermik eval`
and 3 `thermik rl` steps. Without the venv: misbehaving harnesses (over budget, unknown episode, malformed body), each
failing its episode with its reason, no process left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import run_thermik
from env_sources import eval_then_rl
from serving import embedded_engine, running

from thermik.agents.harness_env import HarnessEnv
from thermik.config.agent import AgentConfig
from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.inference.base import Generation
from thermik.models.chat import ChatTokenizer
from thermik.rollout.agent_loop import LoopLimits, rollout_row
from thermik.rollout.trajectory import Trajectory
from thermik.tasks.registry import generate_rows, make_env

TESTS = Path(__file__).resolve().parent
HARNESSES = TESTS / "harnesses"
VENV_PYTHON = Path(os.environ.get("HARNESS_VENV", Path.home() / ".cache/thermik/harness-venv")) / "bin" / "python"
needs_venv = pytest.mark.skipif(
    not VENV_PYTHON.is_file(), reason="the harness venv is absent: make it with `bash scripts/harness_venv.sh`"
)
LIMITS = LoopLimits(max_turns=6, max_input_length=1400, max_generate_length=8, max_sequence_length=1500)
HARNESS_COMMANDS = {
    "openai-chat": "openai_loop.py",
    "openai-chat-stream": "openai_loop.py --stream",
    "agents-chat": "agents_sdk.py chat",
    "agents-chat-stream": "agents_sdk.py chat --stream",
    "agents-responses": "agents_sdk.py responses",
    "agents-responses-stream": "agents_sdk.py responses --stream",
    "langgraph-chat": "langgraph_agent.py chat",
    "langgraph-responses": "langgraph_agent.py responses",
}
# The end-to-end run (eval + 3 RL steps, minutes) of one harness by default (openai-agents over the Responses API,
# streamed: the path no other framework trains), every variant with THERMIK_HARNESS_ALL=1. The per-variant token
# checks above cover each variant's wire format either way.
END_TO_END = list(HARNESS_COMMANDS) if os.environ.get("THERMIK_HARNESS_ALL") == "1" else ["agents-responses-stream"]


@pytest.fixture(scope="module")
def spied_engine(tiny_model_dir: Path):
    """The tiny model's engine, every generation it makes recorded as (prompt ids, sampled ids)."""
    engine, tokenizer = embedded_engine(tiny_model_dir)
    generations: list[tuple[list[int], list[int]]] = []
    generate = engine.generate

    async def recorded(ids: list[int], params: Any, session: str | None = None) -> Any:
        gen = await generate(ids, params, session)
        generations.append((list(ids), list(gen.token_ids)))
        return gen

    def streamed(ids: list[int], params: Any, session: str | None = None) -> Any:
        items = stream(ids, params, session)

        async def recording() -> Any:
            async for item in items:
                if isinstance(item, Generation):
                    generations.append((list(ids), list(item.token_ids)))
                yield item

        return recording()

    stream = engine.stream
    engine.generate, engine.stream = recorded, streamed
    yield engine, ChatTokenizer(tokenizer), generations
    asyncio.run(engine.close())


def _play(spied_engine, cfg: AgentConfig, limits: LoopLimits = LIMITS) -> Trajectory:
    engine, chat, generations = spied_engine
    generations.clear()
    row = generate_rows("reverse_text", 1, 0, split="eval")[0]

    def harness_env(r: dict[str, Any]) -> HarnessEnv:
        inner = make_env("reverse_text", reward_spec=r["reward_spec"], extra_info=r["extra_info"], options=EnvConfig())
        return HarnessEnv(inner, cfg, r)

    return asyncio.run(rollout_row(engine, harness_env, chat, row, limits, SamplingConfig(), 0, 7))


def _sampled_turns(traj: Trajectory) -> list[tuple[list[int], list[int]]]:
    """(every token before the turn, the turn's sampled ids) of each turn of each sample."""
    return [(s.prompt_ids + s.response_ids[:start], s.response_ids[start:end])
            for s in traj.samples for start, end, _ in s.turn_spans]  # fmt: skip


@needs_venv
@pytest.mark.slow
@pytest.mark.parametrize("name", list(HARNESS_COMMANDS))
def test_a_real_harness_episode_records_the_engines_own_tokens(spied_engine, name: str) -> None:
    before = _children()
    command = f"{VENV_PYTHON} {HARNESSES / HARNESS_COMMANDS[name]}"
    traj = _play(spied_engine, AgentConfig(command=command, timeout_s=120))
    _, _, generations = spied_engine
    assert "agent/failed" not in traj.env_metrics, traj.env_metrics
    assert traj.num_turns >= 1 and _sampled_turns(traj) == generations
    assert all(m == 1 for s in traj.samples for a, b, _ in s.turn_spans for m in s.loss_mask[a:b])
    assert _children() - before == set()


@needs_venv
@pytest.mark.slow
@pytest.mark.parametrize("name", END_TO_END)
def test_a_real_harness_runs_eval_and_three_rl_steps(tmp_path: Path, tiny_model_dir: Path, name: str) -> None:
    command = f"{VENV_PYTHON} {HARNESSES / HARNESS_COMMANDS[name]}"
    lengths = ["--rollout.max_input_length", "1400", "--rollout.max_sequence_length", "1500"]
    out = eval_then_rl(tmp_path, tiny_model_dir, "--env.name", "reverse_text", "--agent.command", command,
                       "--agent.timeout_s", "300", *lengths)  # fmt: skip
    assert out["eval"]["n"] == 4
    assert all(step.get("agent/failed", 0.0) == 0.0 for step in out["steps"]), out["steps"]
    assert all(step["response_length/mean"] > 0 for step in out["steps"])


@needs_venv
@pytest.mark.slow
def test_the_same_harness_against_an_api_model_writes_sft_rows_with_its_tools(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`thermik eval --policy.base_url` with the harness: no engine of thermik's, the episodes as SFT rows that
    `thermik sft` trains on."""
    from thermik.inference.server.app import build_app

    engine, tokenizer = embedded_engine(tiny_model_dir)
    with running(build_app(engine, tokenizer, "teacher"), on_exit=engine.close) as url:
        done = run_thermik(
            "eval", "--policy.base_url", f"{url}/v1", "--policy.model", "teacher", "--env.name", "reverse_text",
            "--agent.command", f"{VENV_PYTHON} {HARNESSES / 'openai_loop.py'}", "--eval.size", "3",
            "--output_dir", str(tmp_path), "--name", "teacher", "--monitor.progress", "false", timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "teacher" / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["tools"][0]["function"]["name"] == "add" for r in rows)
    assert all([m["role"] for m in r["messages"]][:3] == ["system", "user", "assistant"] for r in rows)
    done = run_thermik(
        "sft", "--model.path", str(tiny_model_dir), "--train_path", str(tmp_path / "teacher" / "sft.jsonl"),
        "--max_steps", "1", "--batch_size", "3", "--eval_every", "0", "--output_dir", str(tmp_path), "--name", "warm",
        "--progress", "false", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


# ---------------------------------------------------------------------------- misbehaving harnesses (no venv)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "harness.py"
    path.write_text(textwrap.dedent(body))
    return f"{sys.executable} {path}"


CALL = """
    import json, os, sys, urllib.request
    def post(url, body, key=os.environ["OPENAI_API_KEY"]):
        request = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {key}",
                                         "Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=60).status
        except urllib.error.HTTPError as e:
            sys.exit(f"HTTP {e.code}: {e.read().decode()[:300]}")
    chat = lambda base: post(base + "/chat/completions", json.dumps({"model": os.environ["OPENAI_MODEL"],
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode())
"""


def _failed(spied_engine, tmp_path: Path, body: str, **agent: Any) -> tuple[Trajectory, set[int]]:
    before = _children()
    traj = _play(
        spied_engine, AgentConfig(command=_script(tmp_path, textwrap.dedent(CALL) + textwrap.dedent(body)), **agent)
    )
    return traj, _children() - before


def _assert_failed(traj: Trajectory, reason: str) -> None:
    assert traj.env_metrics.get("agent/failed") == 1.0 and traj.env_metrics.get(f"agent/failed_{reason}") == 1.0
    assert traj.reward == 0.0 and all(m == 0 for s in traj.samples for m in s.loss_mask)


def test_a_call_past_the_turn_budget_is_refused_and_fails_the_episode(spied_engine, tmp_path: Path) -> None:
    traj, leaked = _failed(spied_engine, tmp_path, """
        base = os.environ["OPENAI_BASE_URL"]
        chat(base); chat(base)
        print(json.dumps({"reward": 1.0}))
    """, max_turns=1)  # fmt: skip
    _assert_failed(traj, "over_budget")
    assert traj.stop_reason == "max_turns" and traj.num_turns == 1 and leaked == set()


def test_a_call_to_an_unknown_episode_is_a_404_that_fails_the_episode(spied_engine, tmp_path: Path) -> None:
    traj, leaked = _failed(spied_engine, tmp_path, """
        chat(os.environ["OPENAI_BASE_URL"].replace("/episodes/", "/episodes/x"))
        print(json.dumps({"reward": 1.0}))
    """)  # fmt: skip
    _assert_failed(traj, "crash")
    assert leaked == set()


def test_a_malformed_body_is_a_4xx_that_fails_the_episode(spied_engine, tmp_path: Path, capfd) -> None:
    traj, leaked = _failed(spied_engine, tmp_path, """
        post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", b'{"model": "x", "messages": [')
        print(json.dumps({"reward": 1.0}))
    """)  # fmt: skip
    _assert_failed(traj, "crash")
    assert "HTTP 4" in capfd.readouterr().err and leaked == set()


def test_a_hung_harness_is_killed_at_the_timeout(spied_engine, tmp_path: Path) -> None:
    traj, leaked = _failed(spied_engine, tmp_path, """
        import subprocess, time
        chat(os.environ["OPENAI_BASE_URL"])
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(60)
    """, timeout_s=3.0)  # fmt: skip
    _assert_failed(traj, "timeout")
    assert traj.num_turns == 1 and leaked == set()


def test_a_harness_rewarded_by_its_answer_through_the_envs_scorer(spied_engine, tmp_path: Path) -> None:
    """No reward from the harness: its answer goes to the row's env (reverse_text scores the reversal)."""
    row = generate_rows("reverse_text", 1, 0, split="eval")[0]
    answer = f"<reversed>{row['reward_spec']['ground_truth']}</reversed>"
    traj, leaked = _failed(spied_engine, tmp_path, f"""
        chat(os.environ["OPENAI_BASE_URL"])
        print(json.dumps({{"answer": {answer!r}, "metrics": {{"harness/tool_calls": 2}}}}))
    """)  # fmt: skip
    assert "agent/failed" not in traj.env_metrics and traj.reward == pytest.approx(1.0)
    assert traj.env_metrics["harness/tool_calls"] == 2.0 and leaked == set()


POSTING = """
    import json, os, sys
    import httpx
    from openai import OpenAI
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4)
    httpx.post(os.environ["EPISODE_REWARD_URL"], json={"reward": 0.25, "metrics": {"harness/posted": 1.0}},
               timeout=30).raise_for_status()
"""


@pytest.mark.parametrize(("returned", "reward"), [("", 0.25), ('print(json.dumps({"reward": 1.0}))', 1.0)])
def test_a_reward_posted_by_the_harness_is_the_episodes_when_it_returns_none(
    spied_engine, tmp_path: Path, returned: str, reward: float
) -> None:
    """A real openai-SDK harness POSTs 0.25 to EPISODE_REWARD_URL: that is the episode's reward on its last sampled
    token, unless the harness also returns one (which wins, the posted one not added)."""
    path = tmp_path / "posting.py"
    path.write_text(textwrap.dedent(POSTING) + returned + "\n")
    traj = _play(spied_engine, AgentConfig(command=f"{sys.executable} {path}", timeout_s=120))
    assert "agent/failed" not in traj.env_metrics, traj.env_metrics
    assert traj.reward == pytest.approx(reward) and traj.env_metrics["harness/posted"] == 1.0
    last = traj.samples[-1]
    assert last.rewards[last.turn_spans[-1][1] - 1] == pytest.approx(reward)


def test_failed_episodes_are_counted_by_the_rl_verdict_and_the_eval_categories(spied_engine, tmp_path: Path) -> None:
    from thermik.config.schema import FailuresConfig
    from thermik.errors import ThermikError
    from thermik.rollout.metrics import rollout_metrics
    from thermik.rollout.records import trajectory_record
    from thermik.runs.verdict import agent_share

    traj, _ = _failed(spied_engine, tmp_path, "sys.exit(5)\n")
    assert trajectory_record(traj, None, None)["failure"] == "agent_failed"
    ok = Trajectory([1], [2], [1], [0.0], [0], [1.0], turn_spans=[(0, 1, 1)])
    metrics = rollout_metrics([traj, ok]) | {"episodes/played": 2.0}
    assert metrics["episodes/agent_failed"] == 1.0 and metrics["agent/failed_crash"] == 0.5
    verdict_stop = FailuresConfig(max_failed_share=0.25, stop=True)
    from thermik.runs.verdict import Verdict

    with pytest.raises(ThermikError, match=r"1 of 2 agent episodes failed .*crash 50%"):
        Verdict([], [agent_share(verdict_stop)], stop=True).observe(metrics, "step 1")


LIGHT = """
import json, os, urllib.request
task = json.loads(os.environ["THERMIK_TASK"])
body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": task["prompt"], "max_tokens": 8}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=120))
print(json.dumps({"answer": reply["choices"][0]["message"]["content"]}))
"""


@pytest.mark.slow
def test_asynchronous_rl_trains_on_a_harness_episodes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`thermik rl` with trainer.max_async_steps 1: the harness's episodes are produced ahead and trained."""
    (tmp_path / "light.py").write_text(LIGHT)
    done = run_thermik(
        "rl", "--name", "async", "--output_dir", str(tmp_path), "--model.path", str(tiny_model_dir),
        "--env.name", "reverse_text", "--env.max_turns", "1", "--rollout.max_generate_length", "8",
        "--rollout.max_input_length", "384", "--rollout.max_sequence_length", "420", "--monitor.progress", "false",
        "--trainer.steps", "3", "--trainer.prompts_per_step", "2", "--trainer.group_size", "2",
        "--eval.before", "false", "--eval.size", "2", "--trainer.max_async_steps", "1",
        "--agent.command", f"{sys.executable} {tmp_path / 'light.py'}", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward/mean" in x]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["batch/trained_tokens"] > 0 for s in steps)
    assert max(s["off_policy/staleness_max"] for s in steps) == 1.0 and not any("agent/failed" in s for s in steps)

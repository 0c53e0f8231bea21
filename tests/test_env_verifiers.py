"""verifiers v1 environments (`verifiers:<taskset>`): the token-in `/inference/v1/generate` endpoint in verifiers'
wire format, traces turned into trajectories (exact-prefix checked), and, in verifiers' own venv with the taskset of
tests/thermik_vf_echo.py, `thermik eval` and 3 `thermik rl` steps; a bridge gone mid-episode, a missing venv, an
unknown taskset."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest
from env_sources import eval_then_rl
from serving import embedded_engine, running

from thermik.agents.verifiers_episode import _from_trace
from thermik.config.schema import EnvConfig, VerifiersConfig
from thermik.envs.verifiers_env import bridge_for, close_bridges, default_venv
from thermik.rollout.step_wise import PrefixBreakError
from thermik.rollout.trajectory import Trajectory
from thermik.tasks.registry import generate_rows, make_env

TESTS = Path(__file__).resolve().parent
VENV_PYTHON = default_venv() / "bin" / "python"
needs_venv = pytest.mark.skipif(
    not VENV_PYTHON.is_file(), reason="the verifiers venv is absent: make it with `bash scripts/verifiers_venv.sh`"
)
ECHO = "verifiers:thermik-vf-echo"


@pytest.fixture(scope="module", autouse=True)
def _bridges_end_with_this_file():
    """The process keeps a bridge per taskset for its lifetime; this file's end is the test process's 'done'."""
    yield
    close_bridges()


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path):
    from thermik.inference.server.app import build_app

    engine, tokenizer = embedded_engine(tiny_model_dir)
    app = build_app(engine, tokenizer, "tiny")
    with running(app, on_exit=engine.close) as url:
        yield url, len(tokenizer)


def test_generate_answers_in_vllms_wire_format(served) -> None:
    url, _ = served
    body = {"model": "tiny", "token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 6, "logprobs": 1,
            "temperature": 1.0, "stop_token_ids": [3], "skip_special_tokens": False, "seed": 4}}  # fmt: skip
    reply = httpx.post(f"{url}/inference/v1/generate", json=body, headers={"X-Session-ID": "ep-1"}, timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    choice = data["choices"][0]
    assert data["prompt_token_ids"] == [5, 6, 7] and 1 <= len(choice["token_ids"]) <= 6
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])
    assert choice["finish_reason"] in ("stop", "length") and choice["weight_versions"] == [0] * len(choice["token_ids"])
    again = httpx.post(f"{url}/inference/v1/generate", json=body, timeout=60).json()
    assert again["choices"][0]["token_ids"] == choice["token_ids"]  # seeded


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"model": "other"}, "model"),
        ({"token_ids": []}, "token_ids"),
        ({"token_ids": [10**8]}, "token_ids"),
        ({"sampling_params": {"bogus": 1}}, "sampling_params.bogus"),
        ({"sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"sampling_params": {"max_tokens": 10**6}}, "sampling_params.max_tokens"),
    ],
)
def test_generate_refuses_bad_requests_with_a_4xx_naming_the_field(served, change: dict, param: str) -> None:
    url, _ = served
    body = {"model": "tiny", "token_ids": [5, 6], "sampling_params": {"max_tokens": 2}, **change}
    reply = httpx.post(f"{url}/inference/v1/generate", json=body, timeout=60)
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["param"] == param


def _sample(prompt: list[int], sampled: list[int]) -> Trajectory:
    n = len(sampled)
    return Trajectory(prompt, sampled, loss_mask=[1] * n, rollout_logprobs=[-0.1] * n, weight_versions=[0] * n,
                      rewards=[0.0] * n, turn_spans=[(0, n, n)])  # fmt: skip


STOPS = [("agent_completed", [], "stop"), ("max_turns", [], "max_turns"), ("max_output_tokens", [], "length"),
         (None, ["boom"], "abort")]  # fmt: skip


@pytest.mark.parametrize(("condition", "errors", "stop"), STOPS)
def test_the_trace_gives_the_captured_samples_their_reward_stop_reason_and_messages(
    condition: str | None, errors: list[str], stop: str
) -> None:
    """What the capture recorded stays; the trace adds its reward (on the last sampled token of the last sample)."""
    captured = _sample([1, 2], [3, 4])
    captured.continuations = [_sample([9, 8], [7]), _sample([5], [])]
    captured.continuations[1].turn_spans = []  # a sample that sampled nothing gets no reward
    messages = [{"role": "user", "content": "x"}]
    trace = {"reward": 0.75, "stop_condition": condition, "errors": errors, "messages": messages, "branches": [{}, {}]}
    traj = _from_trace(trace, captured)
    assert [s.rewards for s in traj.samples] == [[0.0, 0.0], [0.75], []] and traj.reward == 0.75
    assert traj.stop_reason == stop and traj.messages == trace["messages"]
    assert traj.env_metrics["verifiers_branches"] == 2.0 and ("env_error" in traj.env_metrics) == bool(errors)


def test_a_missing_venv_says_how_to_build_it(tmp_path: Path) -> None:
    options = EnvConfig(name=ECHO, verifiers=VerifiersConfig(python=str(tmp_path / "nope" / "python")))
    with pytest.raises(ValueError, match=r"none at .*nope/python: build it with `bash scripts/verifiers_venv.sh`"):
        generate_rows(ECHO, 4, 0, options=options)


@pytest.fixture
def taskset_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bridge (a child process) imports the test taskset from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@needs_venv
def test_an_unknown_taskset_is_named_by_verifiers(taskset_path: None) -> None:
    with pytest.raises(ValueError, match=r"verifiers could not serve 'no-such-taskset'.*not found"):
        generate_rows("verifiers:no-such-taskset", 4, 0, options=EnvConfig(name="verifiers:no-such-taskset"))


@needs_venv
def test_rows_come_from_the_taskset_and_the_splits_never_share_a_task(taskset_path: None) -> None:
    train, held_out = generate_rows(ECHO, 100, 0, "train"), generate_rows(ECHO, 100, 0, "eval")
    assert len(train) + len(held_out) == 64  # the taskset's tasks, each in one split
    answers = [r["extra_info"]["verifiers_task"]["answer"] for r in train + held_out]
    assert len(set(answers)) == 64
    assert train[0]["prompt"] == [{"role": "user", "content": train[0]["extra_info"]["verifiers_task"]["prompt"]}]


@needs_venv
@pytest.mark.slow
def test_a_bridge_gone_mid_episode_fails_the_episode_not_the_run(taskset_path: None, tiny_model_dir: Path) -> None:
    from thermik.agents.verifiers_episode import play
    from thermik.assembly.components import load_policy
    from thermik.config.schema import ModelConfig, RolloutConfig, SamplingConfig
    from thermik.rollout.agent_loop import LoopLimits

    row = generate_rows(ECHO, 1, 0, "train")[0]
    env = make_env(ECHO, reward_spec={}, extra_info=row["extra_info"], options=EnvConfig(name=ECHO))
    _, chat = load_policy(ModelConfig(path=str(tiny_model_dir)))
    engine, _ = embedded_engine(tiny_model_dir)
    limits = LoopLimits.from_config(RolloutConfig(max_generate_length=8), 2)

    async def episode():
        task = asyncio.create_task(play(engine, env, chat, row["prompt"], limits, SamplingConfig(), 0, 1))
        await asyncio.sleep(1.0)  # the episode is on the verifiers side now
        bridge_for("thermik-vf-echo", VerifiersConfig()).proc.kill()
        try:
            return await asyncio.wait_for(task, 120)
        finally:
            await engine.close()

    traj = asyncio.run(episode())
    assert traj.stop_reason == "abort" and traj.env_metrics["env_error"] == 1.0 and traj.reward == 0.0
    assert "bridge exited" in traj.messages[-1]["content"]


def _play_one(tiny_model_dir: Path, options: EnvConfig, step_wise: str = "on-break"):
    """One episode of the echo taskset's first train row, played by verifiers against an embedded engine."""
    from thermik.agents.verifiers_episode import play
    from thermik.assembly.components import load_policy
    from thermik.config.schema import ModelConfig, RolloutConfig, SamplingConfig
    from thermik.rollout.agent_loop import LoopLimits

    row = generate_rows(ECHO, 1, 0, "train", options=options)[0]
    env = make_env(ECHO, reward_spec={}, extra_info=row["extra_info"], options=options)
    _, chat = load_policy(ModelConfig(path=str(tiny_model_dir)))
    engine, _ = embedded_engine(tiny_model_dir)
    limits = LoopLimits.from_config(RolloutConfig(max_generate_length=8, step_wise=step_wise), 2)

    async def episode():
        try:
            return await asyncio.wait_for(play(engine, env, chat, row["prompt"], limits, SamplingConfig(), 0, 1), 300)
        finally:
            await engine.close()

    return asyncio.run(episode())


REWRITE = EnvConfig(name=ECHO, verifiers=VerifiersConfig(env={"agent": {"harness": {"id": "thermik-vf-rewrite"}}}))


@needs_venv
@pytest.mark.slow
def test_a_trace_whose_conversation_was_rewritten_trains_every_branch(taskset_path: None, tiny_model_dir: Path) -> None:
    """tests/thermik_vf_rewrite.py restarts the context after the first reply: verifiers records two branches."""
    traj = _play_one(tiny_model_dir, REWRITE)
    assert traj.env_metrics["verifiers_branches"] == 2.0 and len(traj.samples) == 2
    assert "prefix_mismatch" not in traj.env_metrics and "env_error" not in traj.env_metrics
    for sample in traj.samples:  # each passed the exact-prefix check with the engine's own per-token facts
        assert sum(sample.loss_mask) > 0 and len(sample.turn_spans) == 1
        assert {v for v, m in zip(sample.weight_versions, sample.loss_mask, strict=True) if m} == {0}
    first, second = traj.samples
    assert traj.num_turns == 2 and len(second.prompt_ids) > len(first.prompt_ids)  # the restarted context quotes
    assert traj.messages[0]["content"].startswith("Before, you said")  # the first reply; its transcript is the last
    with pytest.raises(PrefixBreakError, match=r"2 trainable branches.*rollout.step_wise = 'on-break'"):
        _play_one(tiny_model_dir, REWRITE, step_wise="off")  # one sample per episode was asked for: not silently one


@needs_venv
@pytest.mark.slow
def test_eval_and_rl_run_on_a_verifiers_taskset(tiny_model_dir: Path, tmp_path: Path) -> None:
    eval_then_rl(
        tmp_path, tiny_model_dir, "--env.name", ECHO, "--monitor.save_trajectories_every", "1",
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )  # fmt: skip
    sampled = [json.loads(x) for x in (tmp_path / "rl" / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert len(sampled) == 4
    for traj in sampled:  # every trace passed the exact-prefix check and kept the engine's per-token facts
        assert "prefix_mismatch" not in traj["env_metrics"] and sum(traj["loss_mask"]) > 0
        assert {v for v, m in zip(traj["weight_versions"], traj["loss_mask"], strict=True) if m} == {0}

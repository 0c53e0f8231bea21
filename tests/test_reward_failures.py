"""Reward sources that name their failures (docs/algorithms.md, "Judges and reward models"): an empty judge model
name is asked of /v1/models; the first failed request is printed once with its status and body; groups a source
answered none of are not trained; a run whose judge never answered exits 3 with one line naming the settings."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from serving import running

from thermik.config.schema import JudgeConfig, RewardsConfig
from thermik.errors import NothingDoneError
from thermik.monitor.metrics import read_metrics
from thermik.rollout.judge import Episode, Judge
from thermik.rollout.model_rewards import build_model_rewards
from thermik.rollout.trajectory import Trajectory

SERVED = "rubric-judge"
RUBRIC = "{response}"


def _judge_server(state: dict, status: int = 200) -> FastAPI:
    """A judge as OpenAI-compatible servers are: /v1/models lists SERVED; /v1/chat/completions refuses another model
    name (404, as `thermik inference` does), answers `status` with an error body, or fails prompts holding
    state["fail_when"] with a 500; else it scores 6."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": SERVED, "object": "model", "owned_by": "test"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        state.setdefault("models", []).append(body["model"])
        content, fail_when = body["messages"][0]["content"], state.get("fail_when", "")
        if body["model"] != SERVED:
            return JSONResponse({"error": {"message": f"model {body['model']!r} does not exist"}}, status_code=404)
        if status != 200 or (fail_when and fail_when in content):
            code = status if status != 200 else 500
            return JSONResponse({"error": {"message": f"judge backend exploded ({code})"}}, status_code=code)
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Score: 6"}}]})

    return app


def _episodes(n: int) -> list[Episode]:
    return [
        Episode([{"role": "user", "content": f"q{i}"}], [{"role": "assistant", "content": f"w{i}"}], None)
        for i in range(n)
    ]


def test_an_empty_model_name_is_the_first_one_v1_models_lists():
    state: dict = {}
    with running(_judge_server(state)) as url:
        judge = Judge(JudgeConfig(base_url=url, template=RUBRIC))
        scores = asyncio.run(judge.score(_episodes(3)))
    assert scores.values == [0.6] * 3 and all(scores.answered) and scores.metrics["judge/failures"] == 0
    assert state["models"] == [SERVED] * 3


@pytest.mark.parametrize("status", [400, 500])
def test_the_first_failure_is_printed_once_with_its_status_and_body(status, capsys):
    state: dict = {}
    with running(_judge_server(state, status=status)) as url:
        judge = Judge(JudgeConfig(base_url=url, template=RUBRIC, retries=1, retry_backoff_s=0.01))
        first = asyncio.run(judge.score(_episodes(3)))
        second = asyncio.run(judge.score(_episodes(2)))
    err = capsys.readouterr().err
    assert err.count("rewards.judge failed for the first time") == 1, err
    assert f"answered {status}" in err and f"judge backend exploded ({status})" in err
    assert not any(first.answered + second.answered)
    assert first.metrics[f"judge/http_{status}"] == 3 and second.metrics[f"judge/http_{status}"] == 2


def test_an_empty_name_on_a_server_without_v1_models_names_the_setting(capsys):
    app = FastAPI()  # no routes: /v1/models answers 404
    with running(app) as url:
        scores = asyncio.run(Judge(JudgeConfig(base_url=url, template=RUBRIC)).score(_episodes(2)))
    assert scores.metrics["judge/no_model"] == 2 and not any(scores.answered)
    err = capsys.readouterr().err
    assert "rewards.judge.model is empty and GET" in err and "answered 404" in err


def _two_groups(tag: str) -> list[Trajectory]:
    groups = [0, 0, 1, 1]
    trajs = [Trajectory(prompt_ids=[1], response_ids=[4], loss_mask=[1], rewards=[1.0], group_id=g) for g in groups]
    for i, traj in enumerate(trajs):
        traj.messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"{tag}{i}"}]
    return trajs


def test_groups_the_judge_answered_none_of_are_marked_unscored_and_counted(capsys):
    rows = [{"prompt": [{"role": "user", "content": "q"}], "reward_spec": {}}] * 2
    state: dict = {"fail_when": "w2"}  # group 1: w2 fails, w3 is scored
    with running(_judge_server(state)) as url:
        rewards = build_model_rewards(RewardsConfig(judge=JudgeConfig(base_url=url, template=RUBRIC, retries=0)))
        trajs = _two_groups("w")
        metrics = asyncio.run(rewards.apply(trajs, rows))
        assert [t.unscored for t in trajs] == [False] * 4 and metrics["rewards/unscored_groups"] == 0
        state["fail_when"] = "x"  # now every episode fails
        trajs = _two_groups("x")
        metrics = asyncio.run(rewards.apply(trajs, rows))
    assert [t.unscored for t in trajs] == [True] * 4
    assert metrics["rewards/unscored_groups"] == 2 and metrics["rewards/groups"] == 2
    rewards.after_step(4, metrics)
    assert "step 5: rewards.judge scored no episode of 2 of 2 groups (judge/http_500 4)" in capsys.readouterr().err
    rewards.check_answered()  # it answered earlier in the run: no verdict against it


def test_rewards_of_a_source_that_never_answered_fail_the_run():
    rewards = build_model_rewards(RewardsConfig(judge=JudgeConfig(base_url="http://127.0.0.1:9", retries=0)))
    rewards.check_answered()  # never asked: nothing to say
    trajs = [Trajectory(prompt_ids=[1], response_ids=[4], loss_mask=[1], rewards=[0.0])]
    asyncio.run(rewards.apply(trajs, [{"prompt": [], "reward_spec": {}}]))
    with pytest.raises(NothingDoneError, match=r"rewards\.judge never answered: none of the run's 1 episodes") as exc:
        rewards.check_answered()
    assert "rewards.judge.base_url" in exc.value.hint and exc.value.exit_code == 3


def _two_group_steps(tmp_path, model_dir, name: str, steps: int):
    """A `thermik rl` config of `steps` steps of 2 groups of 2 reverse_text episodes, no evaluation before."""
    from conftest import short_rl_config

    return short_rl_config(
        tmp_path, model_dir, name, "reverse_text",
        trainer={"steps": steps, "prompts_per_step": 2, "group_size": 2}, eval={"before": False, "size": 2},
    )  # fmt: skip


@pytest.mark.slow
def test_a_run_whose_judge_answers_500_trains_nothing_and_exits_3(tiny_model_dir, tmp_path):
    """`thermik rl` as a user runs it, against a real judge server on loopback that answers every chat request with
    a 500: no step is trained (each skips its update), the first failure is printed once, each step warns, and the
    run ends with exit code 3 and one line naming the settings; no traceback."""
    from conftest import run_thermik

    from thermik.config.loader import dump_toml

    cfg = _two_group_steps(tmp_path, tiny_model_dir, "judge-500", steps=2)
    (tmp_path / "rl.toml").write_text(dump_toml(cfg))
    state: dict = {}
    with running(_judge_server(state, status=500)) as url:
        res = run_thermik(
            "rl", "@", str(tmp_path / "rl.toml"), "--rewards.judge.base_url", url, "--rewards.judge.retries", "0",
            timeout=300,
        )  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert res.stderr.count("rewards.judge failed for the first time") == 1
    assert f"POST {url}/v1/chat/completions answered 500" in res.stderr and "judge backend exploded (500)" in res.stderr
    assert "step 1: rewards.judge scored no episode of 2 of 2 groups" in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("thermik rl: rewards.judge never answered: none of the run's 8 episodes got a score"), last
    assert "rewards.judge.base_url" in last and "rewards.judge.model" in last
    assert set(state["models"]) == {SERVED}, "the empty model name was asked of /v1/models"
    steps = [r for r in read_metrics(tmp_path / "judge-500") if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["health/skipped_update"] == 1 and r["rewards/unscored_groups"] == 2 and "policy/loss" not in r


@pytest.mark.slow
def test_max_unscored_steps_stops_the_run_at_the_step(tiny_model_dir, tmp_path):
    from thermik.runs.local import run_rl

    cfg = _two_group_steps(tmp_path, tiny_model_dir, "judge-stop", steps=3)
    state: dict = {}
    with running(_judge_server(state, status=400)) as url:
        judge = JudgeConfig(base_url=url, template=RUBRIC)
        rewards = RewardsConfig(judge=judge, max_unscored_steps=2)
        with pytest.raises(NothingDoneError, match="2 steps in a row trained nothing") as exc:
            run_rl(cfg.model_copy(update={"rewards": rewards}))
    assert "answered 400" in str(exc.value) and "rewards.max_unscored_steps = 2" in exc.value.hint
    assert len(state["models"]) == 2 * 2 * 2, "two steps of 2 x 2 episodes, then the stop"
    logged = [json.dumps(r) for r in read_metrics(tmp_path / "judge-stop") if "time/step" in r]
    assert len(logged) == 1, "the first step is logged; the second stops before its update"


def test_an_empty_batch_crosses_the_split_files_and_skips_the_update(tiny_model_dir, tmp_path):
    """A step whose every group was unscored collates to a batch of no rows; the split protocol carries it and the
    learner of every mode skips the update: parameters and optimizer state stay as they are."""
    import torch

    from thermik.assembly import components
    from thermik.runs.split.protocol import load_batch, save_batch
    from thermik.training.batch import collate
    from thermik.training.learner import build_learner, train_on_batch

    cfg = _two_group_steps(tmp_path, tiny_model_dir, "empty", steps=1)
    policy, chat = components.load_policy(cfg.model)
    learner = build_learner(cfg, policy, chat.tokenizer)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    save_batch(collate([], None, 0), tmp_path)
    batch = load_batch(tmp_path)
    metrics, seconds = asyncio.run(train_on_batch(learner, batch, 0, asynchronous=False))
    assert len(batch) == 0 and metrics == {"health/skipped_update": 1.0, "batch/empty": 1.0} and seconds == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert not learner.optimizer.state, "no optimizer step was taken"

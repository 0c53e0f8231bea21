"""Judges and reward models: failures give the configured value and are counted, never raise; the cache and the
concurrency cap hold; a reward model scores final responses; weights compose; 3 RL steps rewarded by a judge that
`thermik inference` serves."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading

import pytest
import torch
from fastapi import FastAPI, Request
from serving import running, start_thermik_inference

from thermik.config.schema import JudgeConfig, RewardModelConfig, RewardsConfig
from thermik.models.loading import load_model, load_tokenizer
from thermik.monitor.metrics import read_metrics
from thermik.rollout.judge import Episode, Judge, parse_score, render_rubric
from thermik.rollout.model_rewards import ModelRewards, add_final_reward, build_model_rewards
from thermik.rollout.trajectory import Trajectory

SHORT_RUBRIC = "{response}|{ground_truth}"


def _episodes(n: int) -> list[Episode]:
    return [
        Episode(
            prompt=[{"role": "user", "content": f"reverse w{i}"}],
            response=[{"role": "assistant", "content": f"{i}w"}],
            ground_truth=f"{i}w",
        )
        for i in range(n)
    ]


def _judge_app(reply: str, state: dict, delay_s: float = 0.0, fail_first: int = 0) -> FastAPI:
    """A chat endpoint answering `reply`, counting requests and the most in flight at once."""
    app = FastAPI()
    lock = threading.Lock()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        with lock:
            state["requests"] = state.get("requests", 0) + 1
            state["in_flight"] = state.get("in_flight", 0) + 1
            state["max_in_flight"] = max(state.get("max_in_flight", 0), state["in_flight"])
            state.setdefault("prompts", []).append(body["messages"][0]["content"])
            number = state["requests"]
        try:
            await asyncio.sleep(delay_s)
            if number <= fail_first:
                from fastapi.responses import JSONResponse

                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}
        finally:
            with lock:
                state["in_flight"] -= 1

    return app


def _scored(scorer, episodes: list[Episode]) -> tuple[list[float], dict[str, float]]:
    scores = asyncio.run(scorer.score(episodes))
    return scores.values, scores.metrics


def _judge(url: str, **overrides) -> Judge:
    return Judge(JudgeConfig(base_url=url, model="judge", retry_backoff_s=0.01, failure_value=-1.0, **overrides))


def test_scores_parse_cache_and_concurrency_cap():
    state: dict = {}
    with running(_judge_app("Looks right. Score: 8", state, delay_s=0.05)) as url:
        judge = _judge(url, concurrency=2)
        scores, metrics = _scored(judge, _episodes(6))
        assert (
            scores == [0.8] * 6 and metrics["judge/failures"] == 0 and metrics["judge/score_mean"] == pytest.approx(0.8)
        )
        assert state["max_in_flight"] <= 2
        assert "reverse w3" in state["prompts"][0] or any("3w" in p for p in state["prompts"])
        again, metrics = _scored(judge, _episodes(6))
        assert again == scores and metrics["judge/cache_hits"] == 6 and metrics["judge/requests"] == 0
        assert state["requests"] == 6


@pytest.mark.parametrize(
    ("reply", "delay_s", "cause"),
    [("I cannot judge this.", 0.0, "unparsable"), ("Score: 11", 0.0, "unparsable"), ("Score: 5", 2.0, "timeout")],
)
def test_failures_give_the_configured_value_and_are_counted(reply, delay_s, cause):
    state: dict = {}
    with running(_judge_app(reply, state, delay_s=delay_s)) as url:
        scores, metrics = _scored(_judge(url, timeout_s=0.3, retries=1), _episodes(3))
    assert scores == [-1.0] * 3
    assert metrics["judge/failures"] == 3 and metrics[f"judge/{cause}"] == 3
    if cause == "timeout":
        assert metrics["judge/retries"] == 3 and state["requests"] == 6


def test_a_server_that_is_down_gives_the_configured_value():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    scores, metrics = _scored(_judge(f"http://127.0.0.1:{port}", retries=2), _episodes(2))
    assert scores == [-1.0, -1.0] and metrics["judge/unreachable"] == 2 and metrics["judge/retries"] == 4


def test_a_503_is_retried_then_scored():
    state: dict = {}
    with running(_judge_app("Score: 4", state, fail_first=1)) as url:
        scores, metrics = _scored(_judge(url, concurrency=1), _episodes(2))
    assert scores == [0.4, 0.4] and metrics["judge/retries"] == 1 and metrics["judge/failures"] == 0


def test_rubric_and_score_parsing():
    text = render_rubric("Q: {prompt}\nA: {response}\nT: {ground_truth}", _episodes(1)[0])
    assert text == "Q: user: reverse w0\nA: assistant: 0w\nT: 0w"
    pattern = JudgeConfig().score_pattern
    assert parse_score("reasoning... SCORE = 7.5", pattern, 10) == 0.75
    assert parse_score("no number", pattern, 10) is None
    with pytest.raises(ValueError, match="only"):
        JudgeConfig(template="{episode}")


def test_weights_compose_on_the_last_sampled_token():
    traj = Trajectory(prompt_ids=[1, 2], response_ids=[5, 6, 7, 8], loss_mask=[1, 1, 0, 1], rewards=[0, 1.0, 0, 2.0])
    add_final_reward(traj, env_weight=0.5, extra=0.3)
    assert traj.rewards == [0, 0.5, 0, 1.3] and traj.reward == pytest.approx(1.8)


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A one-label sequence classifier on the tiny model's backbone, with its tokenizer."""
    from transformers import AutoModelForSequenceClassification

    out = tmp_path_factory.mktemp("rm") / "rm"
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, local_files_only=True)
    model.save_pretrained(out)
    load_tokenizer(tiny_model_dir).save_pretrained(out)
    return out


def test_reward_model_scores_final_responses_and_composes_with_the_env_reward(reward_model_dir):
    cfg = RewardsConfig(env_weight=2.0, reward_model=RewardModelConfig(path=str(reward_model_dir), weight=0.5))
    rewards = build_model_rewards(cfg)
    scorer = rewards.scorers[0][2]
    episodes = _episodes(3)
    scores, metrics = _scored(scorer, episodes)
    assert metrics["reward_model/score_mean"] == pytest.approx(sum(scores) / 3)
    alone = [scorer._score([scorer.text(e)])[0] for e in episodes]  # one by one, no padding
    assert scores == pytest.approx(alone, abs=1e-5) and len(set(scores)) == 3
    assert "assistant" in scorer.text(episodes[0]) and "0w" in scorer.text(episodes[0])
    trajs = [
        Trajectory(prompt_ids=[1], response_ids=[4, 5], loss_mask=[1, 1], rewards=[0.0, 1.0], group_id=g,
                   messages=[*e.prompt, *e.response])
        for g, e in enumerate(episodes)
    ]  # fmt: skip
    rows = [{"prompt": e.prompt, "reward_spec": {"ground_truth": e.ground_truth}} for e in episodes]
    asyncio.run(rewards.apply(trajs, rows))
    assert [t.reward for t in trajs] == pytest.approx([2.0 + 0.5 * s for s in scores], abs=1e-5)


def test_a_reward_model_scoring_nan_leaves_its_groups_unscored(reward_model_dir):
    """Broken weights (a NaN score head): every score is NaN, so no episode is answered; the run's verdict names
    rewards.reward_model.path."""
    from thermik.errors import NothingDoneError

    rewards = build_model_rewards(RewardsConfig(reward_model=RewardModelConfig(path=str(reward_model_dir))))
    scorer = rewards.scorers[0][2]
    with torch.no_grad():
        scorer.model.score.weight.fill_(float("nan"))
    trajs = [Trajectory(prompt_ids=[1], response_ids=[4], loss_mask=[1], rewards=[1.0], group_id=0) for _ in range(2)]
    for traj, e in zip(trajs, _episodes(2), strict=True):
        traj.messages = [*e.prompt, *e.response]
    metrics = asyncio.run(rewards.apply(trajs, [{"prompt": _episodes(1)[0].prompt, "reward_spec": {}}]))
    assert metrics["reward_model/nonfinite"] == 2 and metrics["rewards/unscored_groups"] == 1
    assert all(t.unscored for t in trajs) and all(math.isfinite(t.reward) for t in trajs)
    with pytest.raises(NothingDoneError, match=r"rewards\.reward_model never answered") as exc:
        rewards.check_answered()
    assert "rewards.reward_model.path" in exc.value.hint


def _train_judge(tiny_model_dir, out, rows) -> None:
    """The tiny model fine-tuned to answer every SHORT_RUBRIC prompt with 'Score: 7' (a judge that parses)."""
    from thermik.config.schema import OptimizerConfig
    from thermik.data.conversations import encode_all
    from thermik.models.chat import ChatTokenizer
    from thermik.training.optim import build_optimizer
    from thermik.training.sft import sft_update

    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    convs = []
    for i, row in enumerate(rows):
        truth = json.dumps(row["reward_spec"]["ground_truth"], sort_keys=True)
        for response in (row["reward_spec"]["ground_truth"], f"x{i}", ""):
            content = SHORT_RUBRIC.format(response=f"assistant: {response}", ground_truth=truth, prompt="")
            convs.append(
                {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "Score: 7"}]}
            )
    examples = encode_all(chat, convs, 256)
    torch.manual_seed(0)
    model = load_model(tiny_model_dir)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-2))
    for step in range(40):
        sft_update(model, examples[(step * 8) % len(examples) :][:8] or examples[:8], 0, optimizer, scheduler, 1.0,
                   pack_tokens=256)  # fmt: skip
    model.save_pretrained(out)
    chat.tokenizer.save_pretrained(out)


@pytest.mark.slow
def test_three_rl_steps_rewarded_by_a_judge_served_by_thermik_inference(tiny_model_dir, tmp_path):
    from conftest import short_rl_config

    from thermik.data.dataset import load_rows
    from thermik.runs.local import run_rl

    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "judged", "reverse_text",
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 2}, eval={"before": False, "size": 2},
    )  # fmt: skip
    _train_judge(tiny_model_dir, tmp_path / "judge", load_rows(str(tmp_path / "train.jsonl"))[:16])
    proc, url = start_thermik_inference(
        tmp_path / "judge.log", "--model.path", str(tmp_path / "judge"), "--server.port", "0",
        "--server.served_model_name", "judge",
    )  # fmt: skip
    try:
        # no rewards.judge.model: the judge sends the name the server's /v1/models lists ("judge")
        judge = {"base_url": url, "template": SHORT_RUBRIC, "max_tokens": 8, "weight": 1.0}
        run_rl(cfg.model_copy(update={"rewards": RewardsConfig(env_weight=0.5, judge=JudgeConfig(**judge))}))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    steps = [r for r in read_metrics(tmp_path / "judged") if "judge/requests" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["judge/requests"] + r.get("judge/cache_hits", 0) == 4
        assert r["judge/failures"] == 0 and r["judge/score_mean"] == pytest.approx(0.7)
        assert 0.7 - 1e-6 <= r["reward/mean"] <= 0.7 + 0.5 + 1e-6, "0.5 * env reward (in [0, 1]) + 0.7"


def test_no_model_rewards_configured_builds_nothing():
    assert build_model_rewards(RewardsConfig()) is None
    assert isinstance(build_model_rewards(RewardsConfig(judge=JudgeConfig(base_url="http://x"))), ModelRewards)


def test_async_metrics_of_several_batches_merge_into_one_step():
    from thermik.rollout.model_rewards import merge_metrics

    merged = merge_metrics(
        [
            {"judge/requests": 4.0, "judge/score_mean": 0.5},
            {"judge/requests": 2.0, "judge/score_mean": 0.7, "judge/timeout": 1.0},
        ]
    )
    assert merged == {"judge/requests": 6.0, "judge/score_mean": pytest.approx(0.6), "judge/timeout": 1.0}


@pytest.mark.slow
def test_asynchronous_training_judges_its_groups_and_logs_every_request(tiny_model_dir, tmp_path):
    from conftest import short_rl_config

    from thermik.runs.local import run_rl

    state: dict = {}
    with running(_judge_app("Score: 6", state)) as url:
        cfg = short_rl_config(
            tmp_path, tiny_model_dir, "async-judged", "reverse_text",
            trainer={"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_async_steps": 1},
            eval={"before": False, "size": 2},
        )  # fmt: skip
        judge = JudgeConfig(base_url=url, model="judge", template=SHORT_RUBRIC)
        run_rl(cfg.model_copy(update={"rewards": RewardsConfig(env_weight=0.0, judge=judge)}))
    records = [r for r in read_metrics(tmp_path / "async-judged") if "reward/mean" in r and "time/step" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["reward/mean"] == pytest.approx(0.6) for r in records), "env_weight 0: the judge's score alone"
    judged = [r for r in records if "judge/score_mean" in r]  # a step logs the groups scored since the last one
    assert judged and all(r["judge/score_mean"] == pytest.approx(0.6) and r["judge/failures"] == 0 for r in judged)
    trained = sum(r["judge/requests"] for r in judged)
    assert trained == 2 * 2 * 2, "every trained episode's request is logged, once"
    # the producer may have judged one more step's groups (max_async_steps 1) before the run ended
    assert state["requests"] in (trained, trained + 2 * 2)


@pytest.mark.slow
def test_a_judge_server_that_is_down_trains_nothing_and_fails_the_run(tiny_model_dir, tmp_path):
    from conftest import short_rl_config

    from thermik.errors import NothingDoneError
    from thermik.runs.local import run_rl

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "judge-down", "reverse_text",
        trainer={"steps": 1, "prompts_per_step": 2, "group_size": 2}, eval={"before": False, "size": 2},
    )  # fmt: skip
    judge = JudgeConfig(base_url=f"http://127.0.0.1:{port}", model="judge", retries=1, retry_backoff_s=0.01,
                        failure_value=0.25)  # fmt: skip
    with pytest.raises(NothingDoneError, match=r"rewards\.judge never answered") as exc:
        run_rl(cfg.model_copy(update={"rewards": RewardsConfig(env_weight=0.0, judge=judge)}))
    assert "did not answer (ConnectError" in str(exc.value)
    (step,) = [r for r in read_metrics(tmp_path / "judge-down") if "judge/failures" in r]
    assert step["judge/failures"] == 4 and step["judge/unreachable"] == 4 and step["judge/retries"] == 4
    assert step["reward/mean"] == pytest.approx(0.25), "every episode holds the configured value, logged"
    assert step["rewards/unscored_groups"] == 2 and step["health/skipped_update"] == 1
    assert "policy/loss" not in step, "no group was trained on the failure value"

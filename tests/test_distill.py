"""On-policy distillation: the reverse-KL advantage against an independent computation, the server teacher against
the in-process one, multi-turn masks, and RL steps distilled from a teacher behind `thermik inference`."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
import torch
from serving import start_thermik_inference

from thermik.algorithms.distill import reverse_kl_advantage
from thermik.config.schema import AlgorithmConfig, TrainerConfig
from thermik.models.chat import ChatTokenizer
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import init_model
from thermik.monitor.metrics import read_metrics
from thermik.rollout.trajectory import Trajectory
from thermik.training.batch import collate
from thermik.training.batch_advantages import apply_distillation
from thermik.training.teacher import LocalTeacher, ServerTeacher, build_teacher


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another qwen2-1m (seed 1): same tokenizer as the student, other weights."""
    return init_model("qwen2-1m", tmp_path_factory.mktemp("teacher") / "teacher", seed=1)


def _multi_turn(seed: int, group: int = 0) -> Trajectory:
    """prompt | sampled turn 1 | observation | sampled turn 2, with rollout logprobs on the sampled tokens only."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(3, 150, (n,), generator=g).tolist()  # noqa: E731
    prompt, turn1, obs, turn2 = ids(7 + seed), ids(4), ids(5), ids(3 + seed)
    mask = [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    logps = [-float(x) for x in torch.rand(len(mask), generator=g) * 3]
    return Trajectory(
        prompt_ids=prompt,
        response_ids=turn1 + obs + turn2,
        loss_mask=mask,
        rollout_logprobs=[lp if m else 0.0 for lp, m in zip(logps, mask, strict=True)],
        rewards=[0.0] * (len(mask) - 1) + [1.0],
        group_id=group,
    )


def _batch():
    return collate([_multi_turn(s, group=s % 2) for s in range(4)], None, pad_id=0)


def _slow_teacher_logp(model, ids: list[int], t: int) -> float:
    """log q(ids[t] | ids[:t]) from the model run on the prefix alone, log-softmax in float64 by hand."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:t]])).logits[0, -1].double()
    top = float(logits.max())
    return float(logits[ids[t]]) - (top + math.log(sum(math.exp(float(x) - top) for x in logits)))


def test_reverse_kl_advantage_matches_an_independent_computation(teacher_dir):
    teacher = load_model(teacher_dir)
    batch = _batch()
    teacher_logp = asyncio.run(LocalTeacher(teacher, TrainerConfig(), None).logprobs(batch))
    adv, metrics = reverse_kl_advantage(batch.rollout_logp, teacher_logp, batch.mask, coef=0.5)
    kls = []
    for i in range(len(batch)):
        seq = batch.input_ids[i, : int(batch.attention_mask[i].sum())].tolist()
        for t in range(1, len(seq)):
            if batch.mask[i, t - 1]:
                k = float(batch.rollout_logp[i, t - 1]) - _slow_teacher_logp(teacher, seq, t)
                kls.append(k)
                assert float(adv[i, t - 1]) == pytest.approx(-0.5 * k, abs=1e-5)
            else:
                assert float(adv[i, t - 1]) == 0.0
    assert metrics["teacher/kl"] == pytest.approx(sum(kls) / len(kls), abs=1e-5)


def test_multi_turn_masks_score_only_sampled_tokens(teacher_dir, tiny_model_dir):
    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    alg = AlgorithmConfig(teacher={"source": str(teacher_dir), "mode": "combined", "coef": 2.0})
    teacher = build_teacher(alg, TrainerConfig(), chat.tokenizer, None, "cpu")
    batch = _batch()
    env_adv = torch.full_like(batch.mask, 0.25) * batch.mask
    batch.adv = env_adv.clone()
    teacher_logp = asyncio.run(teacher.logprobs(batch))
    metrics = apply_distillation(batch, teacher_logp, alg)
    kl = (batch.rollout_logp - teacher_logp) * batch.mask
    torch.testing.assert_close(batch.adv, env_adv - 2.0 * kl)
    assert (batch.adv[batch.mask == 0] == 0).all(), "prompt, observation and padding positions carry nothing"
    t = _multi_turn(1, group=1)  # row 1: its observation tokens sit between the two sampled turns
    p = len(t.prompt_ids)
    obs = slice(p - 1 + 4, p - 1 + 9)
    assert batch.mask[1, obs].sum() == 0 and (batch.adv[1, obs] == 0).all()
    assert batch.mask[1].sum() == sum(t.loss_mask)
    assert metrics["teacher/kl"] == pytest.approx(float(kl.sum() / batch.mask.sum()), abs=1e-6)


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    other = init_model("qwen2-1m", tmp_path / "other", seed=0)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace('"a":', '"A_":', 1))
    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    with pytest.raises(ValueError, match="share one tokenizer"):
        build_teacher(AlgorithmConfig(teacher={"source": str(other)}), TrainerConfig(), chat.tokenizer, None, "cpu")


@pytest.mark.slow
def test_server_teacher_equals_the_in_process_teacher_and_distills_rl_steps(teacher_dir, tiny_model_dir, tmp_path):
    from conftest import short_rl_config

    from thermik.runs.local import run_rl

    proc, url = start_thermik_inference(
        tmp_path / "teacher.log", "--model.path", str(teacher_dir), "--server.port", "0",
        "--inference.precision", "float32",
    )  # fmt: skip
    try:
        batch = _batch()
        local = asyncio.run(LocalTeacher(load_model(teacher_dir), TrainerConfig(), None).logprobs(batch))
        served = asyncio.run(ServerTeacher(url, "", "", 60.0, 4).logprobs(batch))
        on = batch.mask.bool()
        torch.testing.assert_close(served[on], local[on], rtol=0, atol=2e-5)
        bad = [
            ({"stream": True}, "stream"),
            ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ]
        for extra, field in bad:
            body = {"model": "teacher", "prompt": [5, 6, 7], "max_tokens": 1, "prompt_logprobs": 0} | extra
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert reply.status_code == 400 and field in reply.text, reply.text
        kl_local = reverse_kl_advantage(batch.rollout_logp, local, batch.mask)[1]["teacher/kl"]
        kl_served = reverse_kl_advantage(batch.rollout_logp, served, batch.mask)[1]["teacher/kl"]
        assert kl_served == pytest.approx(kl_local, abs=1e-5)
        cfg = short_rl_config(
            tmp_path, tiny_model_dir, "distill", "reverse_text",
            trainer={"steps": 2, "prompts_per_step": 2, "group_size": 2},
            algorithm={"teacher": {"source": url}, "loss": {"type": "importance_sampling"}},
            eval={"before": False, "size": 2},
        )  # fmt: skip
        run_rl(cfg)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    steps = [r for r in read_metrics(tmp_path / "distill") if "teacher/kl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["teacher/kl"]) and r["time/teacher"] > 0 for r in steps)


@pytest.mark.parametrize(
    ("name", "kind"), [("teacher_sft", "sft"), ("student_sft", "sft"), ("distill", "rl"), ("distill", "eval")]
)
def test_the_distillation_example_configs_validate(name, kind):
    from pathlib import Path

    from thermik.config.loader import load_config
    from thermik.config.schema import EvalRunConfig, RunConfig, SFTConfig

    path = Path(__file__).resolve().parents[1] / "examples" / "distillation" / f"{name}.toml"
    cfg = load_config({"sft": SFTConfig, "rl": RunConfig, "eval": EvalRunConfig}[kind], ["@", str(path)], env={})
    if kind == "rl":
        assert cfg.algorithm.teacher.source == "runs/distill-teacher/model" and cfg.algorithm.teacher.mode == "distill"


def test_a_server_teacher_that_is_down_is_named_with_the_way_out():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(
        RuntimeError, match=r"algorithm.teacher.source http://127.0.0.1:\d+ did not answer.*thermik inference"
    ):
        asyncio.run(ServerTeacher(f"http://127.0.0.1:{port}", "t", "", 5.0, 2).logprobs(_batch()))

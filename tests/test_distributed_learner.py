"""One learner step in every mode: the Ray trainer workers run `train_on_batch`, as local mode does, on a real local
Ray cluster (2 trainer workers, 1 colocated engine actor, CPU).

- The critic (gae) and LoRA reproduce local mode's first-step gradients.
- gae, LoRA and asynchronous training (max_async_steps 1) run 3 steps of `thermik rl` together; KL as a reward
  penalty with the adaptive KL controller runs 3 more.
- An engine weight corrupted after a sync stops the run at the weight checksum guard.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from tests.conftest import short_rl_config
from tests.test_algorithms_rl import letter_env, stopping_model_dir  # noqa: F401  (fixtures, used by name)
from tests.test_distributed import max_diff, ray_cluster, single_process_update, uneven_batch  # noqa: F401
from thermik.assembly.guards import ConsistencyError
from thermik.config.schema import RunConfig
from thermik.distributed.launch import start
from thermik.runs import ray as ray_rl
from thermik.runs.loop import rl_plan, run_loop

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GRAD_ATOL = 1e-5  # the ranks change the summation order and the workers' wrapped policy runs the plain forward
DIST = {"enabled": True, "num_trainers": 2, "num_engines": 1, "cpus_per_actor": 0.1, "placement": "colocated"}
STEPS = {"steps": 3, "prompts_per_step": 2, "group_size": 3, "micro_batch_size": 6}


def _config(tmp_path: Path, model_dir: Path, env: str, **sections: dict) -> RunConfig:
    sections = {"trainer": STEPS, "eval": {"size": 2, "before": False}, "distributed": DIST, **sections}
    return short_rl_config(tmp_path, model_dir, "ray-learner", env, train_rows=16, eval_rows=2, **sections)


def _steps(cfg: RunConfig) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step" in r]


@pytest.mark.parametrize(
    "sections",
    [{"algorithm": {"advantage": {"type": "gae"}}}, {"lora": {"enabled": True, "rank": 4}}],
    ids=["gae", "lora"],
)
def test_first_step_gradients_match_local_mode(
    ray_cluster: Any,  # noqa: F811
    tiny_model_dir: Path,
    tmp_path: Path,
    sections: dict,
) -> None:
    """The same config, the same start (seeded policy, LoRA adapters, critic head), the same batch: the workers'
    averaged gradients equal the single-process learner step's."""
    cfg = _config(tmp_path, tiny_model_dir, "reverse_text", **sections)
    dist = start(cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"num_engines": 0})}))
    try:
        batch = uneven_batch()
        metrics = dist.trainer.update(batch, 0)
        grads = dist.trainer.grads()
    finally:
        dist.shutdown()
    model, local_metrics = single_process_update(cfg, None, batch, cfg.trainer, cfg.algorithm)
    local_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == local_grads.keys() and grads
    assert max_diff(grads, local_grads) < GRAD_ATOL
    assert metrics["policy/grad_norm"] == pytest.approx(local_metrics["policy/grad_norm"], rel=1e-5)
    if "algorithm" in sections:  # the critic trained on the whole batch on every rank, as in one process
        assert metrics["critic/loss"] == pytest.approx(local_metrics["critic/loss"], rel=1e-5)
    else:
        assert all("lora_" in name for name in grads)  # only the adapters train


def _check_gae_lora_async(cfg: RunConfig, steps: list[dict[str, float]]) -> None:
    assert all("critic/loss" in r for r in steps)
    assert max(r["off_policy/staleness_max"] for r in steps) <= 1.0
    assert (cfg.run_dir / "export" / "adapter" / "adapter_config.json").is_file()


def _check_kl_reward_adaptive(cfg: RunConfig, steps: list[dict[str, float]]) -> None:
    assert all("policy/kl" in r for r in steps)
    coefs = [r["policy/kl_coef"] for r in steps]
    assert len(set(coefs)) > 1, coefs  # the controller moved the weight


RAY_OPTIONS = {
    # a critic, LoRA adapters and asynchronous training with bounded staleness, together
    "gae_lora_async": (
        {
            "algorithm": {"advantage": {"type": "gae"}},
            "lora": {"enabled": True, "rank": 4},
            "trainer": {**STEPS, "max_async_steps": 1},
        },
        _check_gae_lora_async,
    ),
    # the reference model on every worker, KL subtracted from the rewards, its weight adapted step by step
    "kl_reward_adaptive": (
        {"algorithm": {"kl": {"coef": 0.05, "mode": "reward", "controller": "adaptive", "target": 1e-4}}},
        _check_kl_reward_adaptive,
    ),
}


@pytest.mark.parametrize("case", list(RAY_OPTIONS))
def test_learner_options_run_three_steps_on_ray(
    ray_cluster: Any,  # noqa: F811
    stopping_model_dir: Path,  # noqa: F811
    letter_env: str,  # noqa: F811
    tmp_path: Path,
    case: str,
) -> None:
    sections, check = RAY_OPTIONS[case]
    cfg = _config(tmp_path, stopping_model_dir, letter_env, **sections)
    ray_rl.run_rl(cfg)
    steps = _steps(cfg)
    assert [r["weights/version"] for r in steps] == [1.0, 2.0, 3.0]
    assert any(r["policy/grad_norm"] > 0 for r in steps)
    check(cfg, steps)


def test_a_corrupted_engine_weight_stops_the_ray_run_at_the_checksum_guard(
    ray_cluster: Any,  # noqa: F811
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, tiny_model_dir, "reverse_text", algorithm={"entropy_coef": 0.01})
    tensor = "model.layers.0.mlp.down_proj.weight"

    async def go() -> None:
        dist = start(cfg)
        mode = None
        try:
            mode = ray_rl.setup(cfg, dist)
            sync = dist.sync_weights

            async def corrupting_sync(method: str | None = None) -> tuple[int, float]:
                version, seconds = await sync(method)
                actor = dist.engines.actors[0]
                state = await actor.state_dict.remote()
                await actor.update_weights.remote({tensor: state[tensor] * 8.0})
                return version, seconds

            dist.sync_weights = corrupting_sync
            await run_loop(mode, mode.run, rl_plan(cfg, "corrupted"))
        finally:
            if mode is not None:
                await mode.stop()
                await mode.run.close(engine=False)
            dist.shutdown()

    with pytest.raises(ConsistencyError, match=rf"weight checksum guard .*{tensor} \(engine 0\)"):
        asyncio.run(go())


def test_only_lora_with_fsdp2_is_refused_on_ray(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The options the Ray mode once refused validate; LoRA with FSDP2 is refused with the way out."""
    algorithm = {"advantage": {"type": "gae"}, "kl": {"coef": 0.1, "mode": "reward", "controller": "adaptive"}}
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        "reverse_text",
        algorithm=algorithm,
        lora={"enabled": True},
        trainer={**STEPS, "max_async_steps": 1},
    )
    assert cfg.distributed.enabled and cfg.lora.enabled
    with pytest.raises(ValueError, match=r"distributed\.strategy='ddp' with LoRA"):
        _config(
            tmp_path, tiny_model_dir, "reverse_text", lora={"enabled": True}, distributed={**DIST, "strategy": "fsdp2"}
        )

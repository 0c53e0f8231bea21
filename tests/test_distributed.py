"""Scale-out on a real local Ray cluster: data-parallel trainer workers, engine actors, weight sync, failures.

One cluster (2 CPUs) per module and one DistributedRun (2 trainer workers + 1 engine actor) per module; the
trainer-crash test kills the trainer group, so it runs last.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("ray")
import ray

from tests.conftest import short_rl_config
from tests.test_agent_modes import AGENT, agent_steps
from tests.test_algorithms_rl import letter_env, stopping_model_dir  # noqa: F401  (fixtures, used by name)
from tests.test_distributed_sharding import make_batch
from thermik.assembly import components
from thermik.config.schema import AlgorithmConfig, DistributedConfig, RunConfig, TrainerConfig
from thermik.distributed.launch import DistributedRun, TrainerWorkerError, start
from thermik.distributed.sharding import shard_batch
from thermik.inference.base import SamplingParams
from thermik.runs import ray as ray_rl
from thermik.training.batch import TokenBatch
from thermik.training.checkpoint import load_training_state
from thermik.training.learner import build_learner, train_on_batch
from thermik.training.run_checkpoint import CheckpointWriteError

pytestmark = pytest.mark.ray

GRAD_ATOL = 1e-6  # fp32 (measured max 3e-8): the ranks change only the summation order
PARAM_ATOL = 1e-6  # after one AdamW step, on every weight whose gradient is above SMALL_GRAD (measured 1.2e-7)
SMALL_GRAD = 1e-6
SMALL_GRAD_STEP_FRACTION = 0.25  # AdamW's first step is lr * g / (|g| + eps): for |g| ~ eps = 1e-8 it turns
# ~1e-10 rounding differences in g into moves of a few 1e-2 * lr (measured 8.8e-6 at lr 1e-3 on one CPU, 2.6e-5 on
# an AMD EPYC with AMX: the matmul kernels, so the summation order, differ by CPU; 1.0e-4 on a Xeon with AMX, where
# the single process packs rows into one forward and the workers' wrapped policy runs the padded one); a wrong
# gradient moves ~lr
TEMPERATURE = 1.0


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """Module-scoped, not session-scoped: other tests check that they leave no child processes behind."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def run_config(model_dir: Path, out: Path, **dist: Any) -> RunConfig:
    return RunConfig(
        output_dir=str(out),
        name="dist",
        model={"path": str(model_dir)},
        trainer={"micro_batch_size": 2, "optimizer": {"lr": 1e-3}},
        distributed=DistributedConfig(**{"num_trainers": 2, "num_engines": 1, "cpus_per_actor": 0.5, **dist}),
    )


@pytest.fixture(scope="module")
def dist_run(ray_cluster: Any, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DistributedRun:
    run = start(run_config(tiny_model_dir, tmp_path_factory.mktemp("dist_run")))
    yield run
    run.shutdown()


def uneven_batch(seed: int = 0, vocab: int = 50) -> TokenBatch:
    """6 sequences in two groups of three; the first three (rank 0's shard) are short, the last three long: shard
    token counts differ. Each row's reward sits on its last trained token, so the learner step's advantages vary."""
    batch = make_batch([6, 8, 7, 30, 26, 28], seed=seed, vocab=vocab, prompt=4)
    g = torch.Generator().manual_seed(seed + 100)
    last = batch.mask.cumsum(dim=-1).argmax(dim=-1)
    batch.token_rewards = torch.zeros_like(batch.mask)
    batch.token_rewards[torch.arange(len(batch)), last] = torch.rand(len(batch), generator=g)
    batch.group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    return batch


def with_sections(cfg: RunConfig, alg: AlgorithmConfig, trainer: TrainerConfig) -> RunConfig:
    return cfg.model_copy(update={"algorithm": alg, "trainer": trainer})


def single_process_update(
    cfg: RunConfig, checkpoint: Path | None, batch: TokenBatch, trainer: TrainerConfig, alg: AlgorithmConfig
) -> tuple[torch.nn.Module, dict[str, float]]:
    """The local mode's learner step (train_on_batch) in this process, from the workers' checkpoint (weights, AdamW
    moments, schedule) or, without one, from the start as a worker builds it: the reference the workers reproduce."""
    cfg = with_sections(cfg, alg, trainer)
    components.seed_everything(cfg.seed)
    model, chat = components.load_policy(cfg.model, cfg.lora, cfg.env.tool_parser)
    learner = build_learner(cfg, model, chat.tokenizer)
    if checkpoint is not None:
        extra = load_training_state(checkpoint, model, learner.optimizer)
        learner.scheduler.load_state_dict(extra["scheduler"])
    metrics, _ = asyncio.run(train_on_batch(learner, copy.deepcopy(batch), 0, asynchronous=False))
    return model, metrics


def assert_params_match(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lr: float
) -> None:
    assert max_diff(got, want) < SMALL_GRAD_STEP_FRACTION * lr
    for name, grad in grads.items():
        large = grad.abs() > SMALL_GRAD
        assert float((got[name] - want[name]).abs()[large].max()) < PARAM_ATOL, name


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("reduction", "mini_batches"), [("token_mean", 1), ("sequence_mean", 1)], ids=["token_mean", "sequence_mean"]
)
def test_two_workers_match_single_process(dist_run: DistributedRun, reduction: str, mini_batches: int) -> None:
    cfg = dist_run.cfg
    alg = AlgorithmConfig(reduction={"type": reduction})
    trainer = cfg.trainer.model_copy(update={"mini_batches": mini_batches})
    before = dist_run.trainer.state_dict()
    checkpoint = dist_run.trainer.save_checkpoint(1, {})
    batch = uneven_batch()
    shards = shard_batch(batch, 2, mini_batches, reduction)
    assert shards[0].num_tokens * 3 < shards[1].num_tokens  # uneven, so the global normaliser matters

    metrics = dist_run.trainer.update(batch, 0, cfg=with_sections(cfg, alg, trainer))
    grads, after = dist_run.trainer.grads(), dist_run.trainer.state_dict()
    ref_model, ref_metrics = single_process_update(cfg, checkpoint, batch, trainer, alg)
    ref_grads = {n: p.grad for n, p in ref_model.named_parameters()}
    ref_after = ref_model.state_dict()

    assert max_diff(grads, ref_grads) < GRAD_ATOL
    assert_params_match(after, ref_after, ref_grads, trainer.optimizer.lr)
    assert max_diff(after, before) > 1e-4  # the step moved the weights
    for key in ("policy/loss", "policy/grad_norm", "policy/entropy", "mismatch/logprob_abs_diff"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), key
    # Averaging each shard's own (locally normalised) gradient, what plain DDP would do, is measurably wrong.
    naive = [dict(single_process_update(cfg, checkpoint, s.batch, trainer, alg)[0].named_parameters()) for s in shards]
    naive_grads = {n: (p.grad + naive[1][n].grad) / 2 for n, p in naive[0].items()}
    assert reduction == "sequence_mean" or max_diff(naive_grads, ref_grads) > 100 * GRAD_ATOL


def test_mini_batches_match_single_process(dist_run: DistributedRun) -> None:
    """Two optimizer steps per update: each rank's mini-batch k is its part of global mini-batch k."""
    cfg = dist_run.cfg
    alg, trainer = AlgorithmConfig(), cfg.trainer.model_copy(update={"mini_batches": 2})
    checkpoint = dist_run.trainer.save_checkpoint(2, {})
    batch = uneven_batch(seed=1)
    batch = TokenBatch(
        *(t[torch.tensor([0, 3, 1, 2, 4, 5])] if t is not None else None for t in batch.__dict__.values())
    )
    batch = batch.slice(0, 4)
    dist_run.trainer.update(batch, 0, cfg=with_sections(cfg, alg, trainer))
    ref_model, _ = single_process_update(cfg, checkpoint, batch, trainer, alg)
    # The first AdamW step of the pair moves near-zero-gradient weights by rounding-sized fractions of lr (above);
    # the second step's gradient then sees those weights: the same bound applies.
    assert (
        max_diff(dist_run.trainer.state_dict(), ref_model.state_dict())
        < SMALL_GRAD_STEP_FRACTION * trainer.optimizer.lr
    )


@pytest.mark.parametrize("method", ["collective", "files"])
def test_weight_sync_reaches_engine(dist_run: DistributedRun, method: str) -> None:
    version_before = ray.get(dist_run.engines.actors[0].weight_version.remote())
    version, seconds = asyncio.run(dist_run.sync_weights(method))
    trainer_state = dist_run.trainer.state_dict()
    engine_state = ray.get(dist_run.engines.actors[0].state_dict.remote())
    assert version == version_before + 1 == dist_run.engines.weight_version
    assert max_diff(engine_state, trainer_state) == 0.0
    assert 0 < seconds < 30


def test_pool_pushes_a_state_dict_from_the_driver(dist_run: DistributedRun) -> None:
    """EnginePool.update_weights takes what the single-process loop pushes: a state dict of this process."""
    state = {k: v + 0.01 for k, v in dist_run.trainer.state_dict().items()}
    version = asyncio.run(dist_run.engines.update_weights(state))
    assert version == ray.get(dist_run.engines.actors[0].weight_version.remote())
    assert max_diff(ray.get(dist_run.engines.actors[0].state_dict.remote()), state) == 0.0


def test_killed_engine_is_restarted_and_requests_resubmitted(dist_run: DistributedRun) -> None:
    pool = dist_run.engines
    asyncio.run(dist_run.sync_weights("collective"))
    version, actor = pool.version, pool.actors[0]
    pid_before = ray.get(actor.pid.remote())
    sampling = SamplingParams(max_tokens=1500, temperature=1.0, seed=0)

    async def generate_and_kill() -> tuple[list[Any], int]:
        tasks = [asyncio.create_task(pool.generate([5, 6, 7, 8 + i], sampling)) for i in range(16)]
        await asyncio.sleep(0.05)  # submitted: running or queued on the actor
        in_flight = sum(not t.done() for t in tasks)
        ray.kill(actor, no_restart=False)
        return await asyncio.gather(*tasks), in_flight

    gens, in_flight = asyncio.run(generate_and_kill())
    assert in_flight >= 1, "every request finished before the kill"
    assert pool.num_restarts == 1 and 1 <= pool.num_resubmitted <= in_flight
    assert ray.get(actor.pid.remote()) != pid_before
    assert all(g.stop_reason in ("stop", "length") and g.token_ids for g in gens)
    assert all(g.weight_version == version and set(g.weight_versions) == {version} for g in gens)
    restored = ray.get(actor.state_dict.remote())
    assert max_diff(restored, dist_run.trainer.state_dict()) == 0.0
    # The restarted engine rejoins the broadcast group on the next sync.
    new_version, _ = asyncio.run(dist_run.sync_weights("collective"))
    assert new_version == version + 1 == ray.get(actor.weight_version.remote())


@pytest.mark.parametrize("on_error", ["stop", "continue"])
def test_on_write_error_behaves_on_ray_as_in_one_process(
    dist_run: DistributedRun, on_error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint rank 0 cannot write (its checkpoints directory is a file): 'stop' raises CheckpointWriteError
    in the driver with the single-process message, 'continue' warns there and the workers train on."""
    trainer = dist_run.trainer
    root = trainer.checkpoints.root
    kept = root.with_name("checkpoints.kept")
    root.mkdir(parents=True, exist_ok=True)
    root.rename(kept)
    root.write_text("not a directory")
    cfg = dist_run.cfg.model_copy(
        update={"checkpoint": dist_run.cfg.checkpoint.model_copy(update={"on_write_error": on_error})}
    )
    monkeypatch.setattr(trainer, "cfg", cfg)
    try:
        if on_error == "stop":
            with pytest.raises(CheckpointWriteError, match=r"checkpoint step_7 could not be written .*'stop'"):
                trainer.save_checkpoint(7, {})
        else:
            with pytest.warns(RuntimeWarning, match=r"checkpoint step_7 could not be written .*training goes on"):
                assert trainer.save_checkpoint(7, {}) is None
            metrics = trainer.update(uneven_batch(), 0, cfg=dist_run.cfg)  # every rank is past the barrier
            assert metrics["policy/grad_norm"] > 0
    finally:
        root.unlink()
        kept.rename(root)


def test_trainer_crash_stops_run_with_checkpoint_intact(dist_run: DistributedRun) -> None:
    """Kills the DDP trainer group, so it runs after every other test of dist_run; frees its resources at the end."""
    trainer = dist_run.trainer
    saved = trainer.save_checkpoint(3, {"note": "before crash"})
    ray.kill(trainer.workers[1])
    with pytest.raises(TrainerWorkerError, match=r"rank 1 of 2 failed.*checkpoint is .*step_3"):
        trainer.update(uneven_batch(), 0)
    assert trainer.checkpoints.latest() == saved
    model, _ = components.load_policy(dist_run.cfg.model)
    extra = load_training_state(saved, model, None)
    assert extra["step"] == 3 and extra["note"] == "before crash"
    dist_run.shutdown()  # frees the CPUs for fsdp_run


@pytest.fixture(scope="module")
def fsdp_run(ray_cluster: Any, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DistributedRun:
    """Two FSDP2 trainer workers (gloo, CPU) and no engine."""
    cfg = run_config(tiny_model_dir, tmp_path_factory.mktemp("fsdp_run"), strategy="fsdp2", num_engines=0)
    run = start(cfg)
    yield run
    run.shutdown()


@pytest.mark.slow
def test_fsdp2_resumes_its_checkpoint(fsdp_run: DistributedRun) -> None:
    """FSDP2 ranks load a checkpoint into their shards: weights, AdamW moments, schedule and RNG. The update after
    the resume equals the update made right after the save."""
    trainer = fsdp_run.trainer
    trainer.update(uneven_batch(seed=3), 0)  # AdamW moments and a schedule step to save
    saved = trainer.save_checkpoint(11, {"note": "fsdp2"})
    at_save = trainer.state_dict()
    trainer.update(uneven_batch(seed=4), 1)
    first = trainer.state_dict()
    trainer.update(uneven_batch(seed=5), 2)  # moves weights and moments away from the checkpoint's
    extra = trainer.load_checkpoint(saved)
    assert extra["step"] == 11 and extra["note"] == "fsdp2"
    assert max_diff(trainer.state_dict(), at_save) == 0.0
    trainer.update(uneven_batch(seed=4), 1)
    assert max_diff(trainer.state_dict(), first) == 0.0, "the resumed optimizer state is the saved one"


@pytest.mark.slow
def test_fsdp2_matches_single_process(fsdp_run: DistributedRun) -> None:
    cfg, alg = fsdp_run.cfg, AlgorithmConfig()
    checkpoint = fsdp_run.trainer.save_checkpoint(1, {})
    batch = uneven_batch(seed=2)
    metrics = fsdp_run.trainer.update(batch, 0, cfg=with_sections(cfg, alg, cfg.trainer))
    ref_model, ref_metrics = single_process_update(cfg, checkpoint, batch, cfg.trainer, alg)
    ref_grads = {n: p.grad for n, p in ref_model.named_parameters()}
    assert max_diff(fsdp_run.trainer.grads(), ref_grads) < GRAD_ATOL
    assert_params_match(fsdp_run.trainer.state_dict(), ref_model.state_dict(), ref_grads, cfg.trainer.optimizer.lr)
    assert metrics["policy/grad_norm"] == pytest.approx(ref_metrics["policy/grad_norm"], rel=1e-5)


def test_thermik_rl_on_ray_trains_checkpoints_resumes_and_exports(
    ray_cluster: Any,
    dist_run: DistributedRun,
    stopping_model_dir: Path,  # noqa: F811
    letter_env: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`thermik rl` with distributed.enabled: 2 data-parallel trainer workers + 1 engine actor (small CPU shares,
    beside the module's other run); every step trains and pushes weights, rank 0 checkpoints, a rerun with more
    steps resumes, and the export is a loadable HF model with trained weights."""
    dist = {"enabled": True, "num_trainers": 2, "num_engines": 1, "cpus_per_actor": 0.1}
    sections = {
        "trainer": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "micro_batch_size": 4},
        "eval": {"size": 4},
        "checkpoint": {"every": 1, "keep": 3},
        "distributed": dist,
    }
    cfg = short_rl_config(tmp_path, stopping_model_dir, "ray-rl", letter_env, eval_rows=4, **sections)
    result = ray_rl.run_rl(cfg)
    assert result["after"]["n"] == 4
    steps = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "time/step" in r]
    assert [r["weights/version"] for r in steps] == [1.0, 2.0]
    assert any(r["policy/grad_norm"] > 0 for r in steps)  # a step whose groups are all flat has no gradient
    assert (cfg.run_dir / "checkpoints" / "step_2").is_dir()
    more = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 3})})
    ray_rl.run_rl(more)
    steps = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "time/step" in r] == [1, 2, 3]
    assert [r["weights/version"] for r in steps if "time/step" in r] == [1.0, 2.0, 3.0], "resumed at version 2"
    exported = AutoModelForCausalLM.from_pretrained(cfg.run_dir / "export", local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(stopping_model_dir, local_files_only=True)
    assert max_diff(exported.state_dict(), base.state_dict()) > 0


@pytest.mark.slow
def test_an_agent_harness_trains_on_ray(ray_cluster: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    """`[agent]` on Ray: the driver serves each episode's capture endpoint over the engine actors' pool and runs
    the harness (the openai SDK tool loop, agent.entrypoint) beside it; its episodes train the workers."""
    dist = {"enabled": True, "num_trainers": 1, "num_engines": 1, "cpus_per_actor": 0.1}
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "ray-agent", "reverse_text", train_rows=8, eval_rows=2,
        trainer={"steps": 2, "prompts_per_step": 2, "group_size": 2}, eval={"before": False},
        rollout={"max_generate_length": 8, "max_input_length": 384, "max_sequence_length": 420},
        agent=AGENT, distributed=dist, monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    ray_rl.run_rl(cfg)
    steps = agent_steps(cfg.run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2] and [s["weights/version"] for s in steps] == [1.0, 2.0]

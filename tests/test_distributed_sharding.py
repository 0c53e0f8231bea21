"""Data-parallel sharding math, placement plans and the distributed config, without Ray or a process group.

The gradient test simulates the all-reduce in one process: each shard's gradient, scaled by ShardScaledPolicy,
is averaged the way DDP averages; the result must equal policy_update on the whole batch.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from thermik.assembly import components
from thermik.config.schema import AlgorithmConfig, DistributedConfig, ModelConfig, OptimizerConfig, TrainerConfig
from thermik.distributed.parallel import ShardScaledPolicy
from thermik.distributed.placement import plan_placement
from thermik.distributed.sharding import merge_metrics, shard_batch
from thermik.training.batch import TokenBatch
from thermik.training.loss import LossSetup
from thermik.training.update import policy_update


def make_batch(lengths: list[int], seed: int = 0, vocab: int = 50, prompt: int = 3) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    b, width = len(lengths), max(lengths)
    input_ids = torch.randint(2, vocab, (b, width), generator=g)
    attention = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1))
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
        mask[i, prompt - 1 : n - 1] = 1.0
    adv = (torch.randn(b, 1, generator=g) * mask).contiguous()
    return TokenBatch(input_ids, attention, mask, -torch.rand((b, width - 1), generator=g) * mask, adv)


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
def test_scales_make_shards_sum_to_the_global_mean(reduction: str) -> None:
    batch = make_batch([5, 6, 20, 25, 30, 4, 9, 12], seed=1)
    for world, minis in [(2, 1), (3, 1), (2, 2), (4, 2)]:
        shards = shard_batch(batch, world, minis, reduction)
        assert sum(len(s.batch) for s in shards) == len(batch)
        assert sum(s.num_tokens for s in shards) == batch.num_tokens
        for k in range(minis):
            # DDP averages: sum_r scale_r * (local mean) / W must be the global mean, i.e. sum_r N_r / N = 1.
            assert sum(s.grad_scales[k] for s in shards) / world == pytest.approx(1.0)


def test_shard_batch_rejects_batches_it_cannot_split() -> None:
    with pytest.raises(ValueError, match="3 sequences cannot be shared by 4 trainer workers"):
        shard_batch(make_batch([5, 6, 7]), 4, 1, "token_mean")
    with pytest.raises(ValueError, match="multiple of mini_batches \\* num_trainers = 4"):
        shard_batch(make_batch([5, 6, 7, 8, 9, 10]), 2, 2, "token_mean")


@pytest.mark.parametrize("minis", [1, 2])
def test_simulated_all_reduce_equals_single_process(tiny_model_dir: Path, minis: int) -> None:
    model, _ = components.load_policy(ModelConfig(path=str(tiny_model_dir)))
    # No clipping: here each "rank" would clip its own part, where DDP clips the all-reduced gradient.
    no_clip = OptimizerConfig(max_grad_norm=1e9)
    trainer = TrainerConfig(micro_batch_size=2, mini_batches=minis, optimizer=no_clip)
    alg = AlgorithmConfig()
    batch = make_batch([5, 30, 6, 28], seed=2)  # each mini-batch's two ranks get 5 vs 30 (6 vs 28) tokens

    def grads_after(m: torch.nn.Module, b: TokenBatch, scales: tuple[float, ...] | None) -> dict[str, torch.Tensor]:
        # SGD with lr 0 keeps the weights, so every mini-batch sees the same parameters; the last one's grads stay.
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        policy = m
        if scales is not None:
            policy = ShardScaledPolicy(m)
            policy.set_grad_scales(scales)
            opt.register_step_post_hook(lambda *_: policy.advance_mini_batch())
        policy_update(policy, None, copy.deepcopy(b), LossSetup.from_config(alg, trainer, 1.0), opt, sched)
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    want = grads_after(copy.deepcopy(model), batch, None)
    shards = shard_batch(batch, 2, minis, alg.reduction.type)
    per_rank = [grads_after(copy.deepcopy(model), s.batch, s.grad_scales) for s in shards]
    got = {n: (per_rank[0][n] + per_rank[1][n]) / 2 for n in want}
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-6
    unscaled = [grads_after(copy.deepcopy(model), s.batch, tuple(1.0 for _ in s.grad_scales)) for s in shards]
    naive = {n: (unscaled[0][n] + unscaled[1][n]) / 2 for n in want}
    assert max(float((naive[n] - want[n]).abs().max()) for n in want) > 1e-4  # the scale is what makes it right


def test_merge_metrics_weights_per_token_values_by_token_count() -> None:
    shards = shard_batch(make_batch([5, 25]), 2, 1, "token_mean")  # 2 and 22 sampled tokens
    per_rank = [
        {"policy/entropy": 1.0, "policy/loss": 0.5, "policy/grad_norm": 2.0, "policy/lr": 1e-3},
        {"policy/entropy": 3.0, "policy/loss": 0.1, "policy/grad_norm": 2.0, "policy/lr": 1e-3},
    ]
    out = merge_metrics(per_rank, shards)
    assert out["policy/entropy"] == pytest.approx((1.0 * 2 + 3.0 * 22) / 24)
    assert out["policy/loss"] == pytest.approx((0.5 * 2 + 0.1 * 22) / 24)
    assert out["policy/grad_norm"] == 2.0


def test_placement_plans() -> None:
    dis = plan_placement(DistributedConfig(num_trainers=2, num_engines=3, cpus_per_actor=2, gpus_per_actor=1))
    assert len(dis.bundles) == 5 and dis.bundles[0] == {"CPU": 2, "GPU": 1}
    assert [s.bundle_index for s in dis.trainers + dis.engines] == [0, 1, 2, 3, 4]
    col = plan_placement(
        DistributedConfig(num_trainers=2, num_engines=3, placement="colocated", gpus_per_actor=1, weight_sync="files")
    )
    assert len(col.bundles) == 2
    assert [s.bundle_index for s in col.engines] == [0, 1, 0]
    assert col.trainers[0].num_gpus == col.engines[0].num_gpus == 0.5


def test_config_rejects_nccl_broadcast_between_colocated_actors() -> None:
    with pytest.raises(ValidationError, match="weight_sync='files'"):
        DistributedConfig(backend="nccl", placement="colocated", gpus_per_actor=1)
    with pytest.raises(ValidationError, match="gpus_per_actor > 0"):
        DistributedConfig(backend="nccl")

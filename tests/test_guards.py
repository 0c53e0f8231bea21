"""Consistency guards of the local mode. A real `thermik rl` loop in this process on the tiny model; a
stale or corrupted engine weight is injected into the real embedded engine and the run must stop naming the guard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import torch
from conftest import short_rl_config

from thermik.assembly.guards import ConsistencyError, checksum, weight_mismatches
from thermik.cpu.isa import capabilities
from thermik.monitor.metrics import read_metrics
from thermik.runs.local import LocalMode, setup
from thermik.runs.loop import rl_plan, run_loop

TENSOR = "model.layers.0.mlp.down_proj.weight"


def _run(tmp_path, model_dir, tamper: Callable | None = None, inference: dict | None = None, **guards) -> dict:
    cfg = short_rl_config(
        tmp_path, model_dir, "guards", "reverse_text", train_rows=16, eval_rows=2,
        trainer={"steps": 3, "prompts_per_step": 2, "group_size": 2}, algorithm={"entropy_coef": 0.01},
        eval={"before": False, "size": 2}, guards=guards, inference=inference or {},
    )  # fmt: skip

    async def go() -> dict:
        run = setup(cfg)
        mode = LocalMode(run)
        if tamper is not None:
            tamper(run.rollout.engine)
        try:
            return await run_loop(mode, run, rl_plan(cfg, "guards"))
        finally:
            await mode.stop()
            await run.close()

    return asyncio.run(go())


def _stale(engine) -> None:
    """The sync never delivers TENSOR: the engine keeps its first version of it."""
    first, update = engine.model.state_dict()[TENSOR].clone(), engine.update_weights

    async def stale_update(state):
        return await update({**state, TENSOR: first})

    engine.update_weights = stale_update


def _corrupt(name: str) -> Callable:
    def tamper(engine) -> None:
        update = engine.update_weights

        async def corrupting_update(state):
            version = await update(state)
            with torch.no_grad():
                engine.model.state_dict()[name].mul_(8.0)  # in place: the engine's own storage
            return version

        engine.update_weights = corrupting_update

    return tamper


def test_checksum_is_exact_and_layout_independent():
    t = torch.randn(64, 32)
    assert checksum(t) == checksum(t.t().contiguous().t()) == checksum(t.clone())
    bumped = t.clone()
    bumped[3, 7] = torch.nextafter(bumped[3, 7], torch.tensor(10.0))  # one ulp
    assert checksum(bumped) != checksum(t)
    assert weight_mismatches({"a": t, "b": t}, {"a": t.to(torch.bfloat16), "b": bumped.to(torch.bfloat16)}) in (
        ["b"],
        [],  # one ulp of float32 may vanish in bfloat16
    )
    assert weight_mismatches({"a": t}, {}) == ["a (absent in the engine)"]
    # A plain wrapping sum of the bits misses these: every element changes by the same multiple of 2^23 / 2^31.
    w = torch.randn(512, 256)
    assert len({checksum(w), checksum(w * 8), checksum(-w), checksum(w.to(torch.bfloat16) * 2)}) == 4


def _edge_floats(n: int) -> torch.Tensor:
    """Random float32 values plus the cases bfloat16 rounding must get right: ties (odd and even), values that round
    up into the exponent, infinities, signed zeros, denormals."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x00008000, 0x80018000], dtype=torch.int64).to(
        torch.int32
    )
    special = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -3e-39, 65504.0, -1.0])
    return torch.cat([torch.randn(n) * 100, ties.view(torch.float32), special])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_c_checksum_gives_the_pytorch_paths_integers(monkeypatch, threads):
    """kernels/checksum.c against the PyTorch path (THERMIK_CPU_KERNELS=0) on every type pair it reads, including a
    float32 tensor checksummed as its bfloat16 rounding, strided views, and more elements than one thread takes."""
    torch.set_num_threads(threads)
    x = _edge_floats(200_003)
    cases = [(x, None), (x, torch.bfloat16), (x.to(torch.bfloat16), None), (x.to(torch.float16), None)]
    cases += [
        (torch.randn(70_001).view(torch.int32), None),
        (torch.randn(9, dtype=torch.float16).view(torch.int16), None),
    ]
    fused = x[: 250 * 700].view(250, 700)  # the engine's projections: column slices of a fused weight, transposed
    cases += [(fused[:, 100:400].t(), None), (fused[:, 100:400], torch.bfloat16), (fused.bfloat16()[:, :50].t(), None)]
    fast = [checksum(t, dtype) for t, dtype in cases]
    monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    assert fast == [checksum(t, dtype) for t, dtype in cases]
    assert fast[1] == checksum(x.to(torch.bfloat16))  # the kernel's rounding is torch's


def test_a_nan_checksummed_as_bfloat16_takes_the_pytorch_path():
    """torch's own float32 -> bfloat16 conversions differ on NaN (scalar 0x7FC0, vectorized 0xFFFF): the kernel
    declines and the checksum is that of the tensor torch converts."""
    x = _edge_floats(1000)
    x[17] = float("nan")
    assert checksum(x, torch.bfloat16) == checksum(x.to(torch.bfloat16))


def test_a_healthy_run_passes_both_guards(tmp_path, tiny_model_dir):
    out = _run(tmp_path, tiny_model_dir, parity_every=1)
    rows = [r for r in read_metrics(tmp_path / "guards" / "metrics.jsonl") if "guards/parity_max_abs_diff" in r]
    assert len(rows) == 3 and all(r["guards/parity_max_abs_diff"] < 1e-3 for r in rows), rows
    assert out is not None


def test_a_stale_engine_weight_stops_the_run_at_the_checksum_guard(tmp_path, tiny_model_dir):
    with pytest.raises(ConsistencyError, match=f"weight checksum guard .*1 of \\d+ tensors .*{TENSOR}"):
        _run(tmp_path, tiny_model_dir, _stale)


def test_a_corrupted_engine_tensor_stops_the_run_at_the_checksum_guard(tmp_path, tiny_model_dir):
    with pytest.raises(ConsistencyError, match=f"weight checksum guard .*{TENSOR}"):
        _run(tmp_path, tiny_model_dir, _corrupt(TENSOR))


def test_without_the_checksum_the_parity_probe_catches_the_corruption(tmp_path, tiny_model_dir):
    with pytest.raises(ConsistencyError, match=r"logprob parity probe guard .*after step 1.*not running the trainer's"):
        _run(tmp_path, tiny_model_dir, _corrupt("model.norm.weight"), weight_checksum=False, parity_every=1)


@pytest.mark.skipif(not capabilities().bf16_runs, reason="a bfloat16 engine needs a CPU whose bfloat16 ops run")
def test_a_parity_gap_after_a_passed_checksum_is_named_numerical(tmp_path, tiny_model_dir):
    """A bfloat16 engine holds the float32 trainer's weights rounded (the checksum compares in the engine's dtype and
    passes); its logprobs differ from the trainer's by bfloat16 arithmetic. Over the limit, the message says that and
    what to change, not that the engine runs other weights."""
    numerical = r"checksum guard passed.*numerical: the engine's precision \(bfloat16\).*guards\.parity_max_abs_diff"
    with pytest.raises(ConsistencyError, match=r"parity probe guard .*" + numerical + r".*inference\.precision") as err:
        _run(tmp_path, tiny_model_dir, parity_every=1, parity_max_abs_diff=1e-6, inference={"precision": "bfloat16"})
    assert "not running the trainer's weights" not in str(err.value)

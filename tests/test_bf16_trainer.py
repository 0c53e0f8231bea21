"""Mixed-precision training (`model.train_precision = "bf16-mixed"`, training/mixed_precision.py) against float32.

Tolerances come from bfloat16's unit roundoff u = 2^-8 (8 significand bits): autocast rounds every matrix product's
inputs to bfloat16 (relative error <= u/2 each) and its output once more, forward and backward. These roundings are
independent and add in quadrature along the ~8 products per layer, forward and backward, and are amplified by the
network's own conditioning; on the 5M preset the whole-gradient relative error measures 13u-18u (0.05-0.07) at every
batch size tried (16 to 1024 tokens: it does not grow with the token count), SmolLM2-135M 24u. The bound, 32u =
0.125, is about twice the measured value; the cosine similarity bound 0.99 is what a 0.14 relative error of equal
norms gives (cos = 1 - rel^2 / 2), so both say "the same gradient, bfloat16-rounded". A lower bound of u/8 checks
that bfloat16 arithmetic actually ran (float32 against itself differs by ~1e-7).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from thermik.config.schema import AlgorithmConfig, ModelConfig, OptimizerConfig, TrainerConfig
from thermik.cpu.engine_precision import AUTO_PRECISION_ENV
from thermik.cpu.isa import capabilities
from thermik.models.presets import init_model
from thermik.training.batch import TokenBatch
from thermik.training.loss import LossSetup, micro_batch_loss, mini_batch_reduction
from thermik.training.mixed_precision import resolve_train_precision
from thermik.training.optim import build_optimizer
from thermik.training.sft import sft_loss, sft_update
from thermik.training.update import batch_logprobs, policy_update

U = 2.0**-8  # bfloat16 unit roundoff
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = init_model("qwen2-5m", Path(tmp_path_factory.mktemp("q5")) / "qwen2-5m", seed=1)
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)


def rl_batch(vocab: int, rows: int = 8, prompt: int = 24, response: int = 40) -> TokenBatch:
    """Two groups of four rows sharing their prompt (so the shared-prefix forward runs), advantages of both signs."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (prompt,), generator=gen) for _ in range(2)]
    responses = [torch.randint(1, vocab, (response,), generator=gen) for _ in range(rows)]
    ids = torch.stack([torch.cat([prompts[i // 4], r]) for i, r in enumerate(responses)])
    mask = torch.zeros(rows, prompt + response - 1)
    mask[:, prompt - 1 :] = 1
    adv = torch.randn(rows, 1, generator=gen) * mask
    rollout = torch.full_like(mask, -3.0)
    group_ids, prompt_lens = torch.arange(rows) // 4, torch.full((rows,), prompt)
    return TokenBatch(ids, torch.ones_like(ids), mask, rollout, adv, group_ids=group_ids, prompt_lens=prompt_lens)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()]).double()


def rl_gradient(model: torch.nn.Module, batch: TokenBatch, autocast: torch.dtype | None) -> tuple[torch.Tensor, ...]:
    """The gradient of the RL loss (PPO clip + entropy bonus) by the trainer's own forward and loss."""
    setup = LossSetup.from_config(AlgorithmConfig(entropy_coef=0.01), TrainerConfig(), 1.0, autocast=autocast)
    model.zero_grad()
    logp, entropy = batch_logprobs(model, batch, 1.0, shared_prefix=True, autocast=autocast)
    loss, _ = micro_batch_loss(setup, batch, logp, entropy, mini_batch_reduction(setup, batch)(0, len(batch)))
    loss.backward()
    return flat_grad(model), logp.detach(), entropy.detach()


def assert_bf16_rounded_copy(g16: torch.Tensor, g32: torch.Tensor) -> None:
    cos = float(g16 @ g32 / (g16.norm() * g32.norm()))
    rel = float((g16 - g32).norm() / g32.norm())
    assert cos > 0.99, cos
    assert U / 8 < rel < 32 * U, rel / U


def test_rl_gradient_under_bf16_mixed_matches_float32(model: torch.nn.Module) -> None:
    batch = rl_batch(model.config.vocab_size)
    g32, logp32, ent32 = rl_gradient(model, batch, None)
    g16, logp16, ent16 = rl_gradient(model, batch, BF16)
    assert_bf16_rounded_copy(g16, g32)
    # Logprobs and entropies are float32 (the logits are cast before the log-softmax) and near float32's.
    assert logp16.dtype == ent16.dtype == torch.float32
    on = batch.mask.bool()
    assert float((logp16 - logp32)[on].abs().mean()) < 32 * U
    assert float((ent16 - ent32)[on].abs().mean()) < 32 * U
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_sft_gradient_under_bf16_mixed_matches_float32(model: torch.nn.Module) -> None:
    ids = torch.randint(1, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    examples = [(row.tolist(), [0] * 16 + [1] * 48) for row in ids]
    grads = []
    for autocast in (None, BF16):
        model.zero_grad()
        sft_loss(model, examples, 0, autocast).backward()
        grads.append(flat_grad(model))
    assert_bf16_rounded_copy(grads[1], grads[0])


def test_projections_run_in_bf16_only_under_bf16_mixed(model: torch.nn.Module) -> None:
    seen: list[torch.dtype] = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    batch = rl_batch(model.config.vocab_size, rows=4)
    with torch.no_grad():
        batch_logprobs(model, batch, 1.0, shared_prefix=False, autocast=None)
        batch_logprobs(model, batch, 1.0, shared_prefix=False, autocast=BF16)
        batch_logprobs(model, batch, 1.0, shared_prefix=True, autocast=BF16)  # prompts, then responses
    hook.remove()
    assert seen == [torch.float32, BF16, BF16, BF16]


def test_master_weights_and_adamw_state_stay_float32_and_keep_small_updates(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # lr 1e-6: Adam's first step moves each weight by ~1e-6, far below bfloat16's resolution of a weight of ~0.1
    # (2^-8 * 0.1 = 4e-4). Pure bfloat16 weights would round it away; float32 master weights keep it.
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-6))
    ids = torch.randint(1, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2))
    sft_update(model, [(r.tolist(), [1] * 32) for r in ids], 0, optimizer, scheduler, 1.0, BF16)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    states = [s for s in optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(moved) == len(before)
    w = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"].detach()
    assert 0 < float((w - before["model.layers.0.mlp.up_proj.weight"]).abs().max()) < U * 0.1 / 10


def test_bf16_mixed_sft_overfits_a_tiny_batch(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True, dtype=torch.float32)
    ids = torch.randint(1, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    examples = [(r.tolist(), [1] * 24) for r in ids]
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-2))
    losses = [sft_update(model, examples, 0, optimizer, scheduler, 1.0, BF16)["sft/loss"] for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_bf16_mixed_policy_update_moves_logprobs_with_the_advantage(tiny_model_dir: Path) -> None:
    """The RL update in bf16-mixed (policy_update, as `thermik rl` runs it): positive-advantage rows' logprobs
    rise above negative ones'. (The PPO loss itself is constant at ratio 1, so the logprobs are the measure.)"""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True, dtype=torch.float32)
    batch = rl_batch(model.config.vocab_size, rows=4, prompt=8, response=12)
    batch.adv = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]]) * batch.mask

    def row_means() -> torch.Tensor:
        with torch.no_grad():
            logp, _ = batch_logprobs(model, batch, 1.0, autocast=BF16)
        return (logp * batch.mask).sum(1) / batch.mask.sum(1)

    start = row_means()
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-2))
    setup = LossSetup.from_config(AlgorithmConfig(), TrainerConfig(), 1.0, autocast=BF16)
    for _ in range(10):
        metrics = policy_update(model, None, batch, setup, optimizer, scheduler)
        assert metrics["health/skipped_steps"] == 0
    gain = row_means() - start
    assert float(gain[0]) > 1.0 and float(gain[2]) > 1.0, gain
    assert float(gain[1]) < -1.0 and float(gain[3]) < -1.0, gain


def test_precision_config_and_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ModelConfig().train_precision == "auto"
    with pytest.raises(ValueError, match="train_precision 'bf16-mixed' keeps float32 master weights"):
        ModelConfig(train_precision="bf16-mixed", dtype="bfloat16")
    ModelConfig(dtype="bfloat16")  # the default "auto" trains a bfloat16 model in bfloat16
    cpu = torch.device("cpu")
    assert resolve_train_precision("float32", cpu)[0] is None
    assert resolve_train_precision("bf16-mixed", cpu)[0] is BF16
    assert resolve_train_precision("auto", cpu, "bfloat16") == (None, "train_precision 'auto' with model.dtype "
                                                                "'bfloat16' trains in bfloat16")  # fmt: skip
    monkeypatch.setenv(AUTO_PRECISION_ENV, "float32")
    dtype, reason = resolve_train_precision("auto", cpu)
    assert dtype is None and AUTO_PRECISION_ENV in reason
    monkeypatch.delenv(AUTO_PRECISION_ENV)
    dtype, reason = resolve_train_precision("auto", cpu)
    assert (dtype is BF16) == capabilities().bf16_native, reason
    with pytest.raises(ValueError, match="valid precisions: float32, bf16-mixed, auto"):
        resolve_train_precision("fp8", cpu)


@pytest.fixture(scope="module")
def bench():
    from tests.conftest import load_benchmark

    yield from load_benchmark("trainer_mfu")


def test_trainer_mfu_benchmark_runs_all_variants(bench, capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    argv = ["--preset", "qwen2-1m", "--batch", "2", "--seq", "16", "--rounds", "1", "--threads", "1", "--before"]
    try:
        variants = bench.main(argv)
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide: later tests keep theirs
    names = ["full float32", "full bf16-mixed", "lora float32", "lora bf16-mixed", "full float32-before"]
    assert [v.name for v in variants] == names
    assert all(0 < v.best_s < float("inf") for v in variants)
    out = capsys.readouterr().out
    assert "full: bf16-mixed / float32 tokens/s" in out and "lora: bf16-mixed / float32 tokens/s" in out
    assert "float32 FMA peak (2048^3 matmul" in out and "of FMA peak" in out and "ISA: " in out
    assert "full: bf16-mixed / float32-before tokens/s" in out


def test_default_run_is_bf16_on_a_bf16_cpu(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`thermik rl` with no precision settings, on a CPU that reports AVX512-BF16 or AMX-BF16: both the engine and
    the trainer say they run bfloat16 and why, the run trains, and the mismatch metric sees the two precisions."""
    from tests.conftest import run_thermik
    from thermik.data.dataset import write_rows
    from thermik.tasks.registry import generate_rows

    monkeypatch.delenv(AUTO_PRECISION_ENV)
    caps = capabilities()
    if not caps.bf16_native:
        pytest.skip(f"needs avx512_bf16 or amx ('auto' is float32 on this CPU, {caps.describe()}: tested above)")
    write_rows(tmp_path / "train.jsonl", generate_rows("reverse_text", 16, 0, split="train"))
    res = run_thermik(
        "rl", "--model.path", str(tiny_model_dir), "--env.name", "reverse_text", "--env.max_turns", "1",
        "--data.train_path", str(tmp_path / "train.jsonl"), "--rollout.max_generate_length", "8",
        "--trainer.steps", "2", "--trainer.prompts_per_step", "2", "--trainer.group_size", "4",
        "--eval.before", "false", "--eval.size", "2", "--monitor.progress", "false", "--output_dir", str(tmp_path),
        "--name", "default", timeout=300, **{AUTO_PRECISION_ENV: ""},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    reason = f"the CPU is {caps.describe()}: native bfloat16 dot products"
    assert f"thermik trainer: bf16-mixed ({reason})" in res.stderr
    assert f"thermik embedded engine: bfloat16 (inference.precision = 'auto' and {reason})" in res.stderr
    rows = [json.loads(line) for line in (tmp_path / "default" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "mismatch/logprob_abs_diff" in r]
    assert len(steps) == 2 and all(0 < r["mismatch/logprob_abs_diff"] < 0.5 for r in steps), steps


def test_lm_head_precision_float32_under_autocast_keeps_the_state_dict(model: torch.nn.Module) -> None:
    """model.lm_head_precision: 'float32' gives float32 logits under bf16 autocast (equal to the float32 forward's
    within the body's rounding), 'bf16' gives autocast's bfloat16 ones; parameters and state-dict keys are the same;
    'auto' picks float32 for a head that is a small share of the parameters (the byte-vocabulary presets) and bf16
    for a large one."""
    from thermik.training.mixed_precision import Float32LMHead, set_lm_head_precision

    ids = torch.randint(1, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    keys = list(model.state_dict())
    try:
        assert set_lm_head_precision(model, "float32").startswith("float32")
        with torch.autocast("cpu", dtype=BF16):
            head32 = model(ids).logits
        assert isinstance(model.lm_head, Float32LMHead) and head32.dtype == torch.float32
        assert list(model.state_dict()) == keys
        assert set_lm_head_precision(model, "bf16").startswith("bfloat16")
        with torch.autocast("cpu", dtype=BF16):
            assert model(ids).logits.dtype == BF16
        assert "float32" in set_lm_head_precision(model, "auto").split(" (")[0]  # 5M preset: a small byte-vocab head
    finally:
        set_lm_head_precision(model, "bf16")
    big = torch.nn.Module()
    big.head, big.body = torch.nn.Linear(8, 100, bias=False), torch.nn.Linear(8, 8)
    big.get_output_embeddings = lambda: big.head
    assert set_lm_head_precision(big, "auto").startswith("bfloat16 (the lm head holds 92%")
    assert type(big.head) is torch.nn.Linear

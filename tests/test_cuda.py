"""thermik on a CUDA device (`model.device = "cuda"`): engine, sampler, trainer, SFT, critic and `thermik rl`/`sft`.

Every test here needs a GPU (marker gpu; conftest skips them without one). `scripts/gpu_check.sh` runs them on a
lent GPU machine (docs/gpu.md). Values are checked against the CPU: float32 on the GPU equals float32 on the CPU to
float rounding; bfloat16 is checked against float32 with bfloat16's tolerance.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import run_thermik, shared_prompt_batch
from tests.vllm_support import check_generation
from thermik.assembly.guards import weight_mismatches
from thermik.config.schema import AlgorithmConfig, CriticConfig, ModelConfig, OptimizerConfig, TrainerConfig
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import embedded_engine
from thermik.inference.hf_engine import HFEngine
from thermik.inference.kv_cache import default_budget_bytes
from thermik.inference.native_model import NativeCausalLM
from thermik.inference.sampling import fused_sample, process_logits, sample, token_logprobs
from thermik.training.critic import Critic
from thermik.training.loss import LossSetup
from thermik.training.optim import build_optimizer
from thermik.training.sft import sft_update
from thermik.training.shared_prefix import token_logprobs_shared
from thermik.training.update import batch_logprobs, policy_update
from thermik.training.vocab_logprobs import vocab_logprobs

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
EOS = 258  # the qwen2-1m preset tokenizer's eos
PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [8, 9], [120, 121, 122, 123], [77, 78, 79, 80, 81, 82, 83, 84, 85]]


@pytest.fixture(scope="module")
def cpu_model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def on_cuda(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model).to(CUDA)


def test_native_forward_on_cuda_equals_the_cpu(cpu_model: torch.nn.Module) -> None:
    logits = []
    for device in ("cpu", "cuda"):
        native = NativeCausalLM(copy.deepcopy(cpu_model).to(device))
        cache = native.new_cache(4, 64)
        tokens = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
        prefill = native.forward(tokens, torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([4, 2]), cache)
        decode = (torch.tensor([[3], [4]]), slice(0, 2), torch.tensor([5, 3]), torch.zeros(2, dtype=torch.long))
        step = native.forward(*decode, cache)
        logits.append(torch.cat([prefill, step]).cpu())
    assert logits[1].device.type == "cpu"
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_embedded_engine_on_cuda_samples_the_models_logprobs(
    cpu_model: torch.nn.Module, tiny_model_dir: Path, precision: str
) -> None:
    """Seeded sampling, per-row temperatures, greedy rows and top logprobs on the GPU, scored against transformers
    on the CPU (float32: the reference's tolerance; bfloat16: 0.15)."""
    engine = embedded_engine(on_cuda(cpu_model), precision, eos_token_ids=[EOS], pad_token_id=0, seed=1)
    assert engine.device.type == "cuda" and next(engine.model.parameters()).dtype == getattr(torch, precision)
    samplings = [SamplingParams(max_tokens=12, temperature=t, seed=s, top_logprobs=2) for t, s in
                 ((1.0, 1), (0.0, None), (0.7, 3), (1.0, 4))]  # fmt: skip
    gens = engine.generate_batch(PROMPTS, samplings)
    again = engine.generate_batch(PROMPTS, samplings)
    asyncio.run(engine.close())
    if precision == "float32":  # seeded and greedy rows repeat (the second call reuses the cached prompts)
        assert [g.token_ids for g in gens] == [g.token_ids for g in again]
    for prompt, gen, sampling in zip(PROMPTS, gens, samplings, strict=True):
        if precision == "float32":
            check_generation(tiny_model_dir, prompt, gen.__dict__, sampling.temperature, sampling.max_tokens)
            continue
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = cpu_model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / (sampling.temperature or 1.0)
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert (torch.tensor(gen.logprobs) - ref).abs().max() < 0.15


def test_weight_update_on_cuda_lands_in_the_engine(cpu_model: torch.nn.Module) -> None:
    engine = embedded_engine(on_cuda(cpu_model), "bfloat16", eos_token_ids=[EOS], pad_token_id=0)
    new = {k: v + 0.01 for k, v in cpu_model.state_dict().items()}  # a CPU float32 state, as a file would give
    assert engine.update_weights_sync(new) == 1
    assert weight_mismatches(new, engine.model.state_dict()) == []
    gen = engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=4, seed=0)])[0]
    asyncio.run(engine.close())
    assert gen.weight_versions == [1] * len(gen.token_ids)


def test_hf_engine_on_cuda_samples_the_models_logprobs(cpu_model: torch.nn.Module, tiny_model_dir: Path) -> None:
    engine = HFEngine(on_cuda(cpu_model), eos_token_ids=[EOS], pad_token_id=0)
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    gen = asyncio.run(engine.generate(PROMPTS[2], sampling))
    check_generation(tiny_model_dir, PROMPTS[2], gen.__dict__, 1.0, 8)


def test_sampling_on_cuda_matches_the_cpu_arithmetic() -> None:
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0))
    knobs = tuple(torch.tensor(v) for v in ([0.0, 1.0, 0.7], [0, 50, 0], [1.0, 0.9, 1.0], [0.0, 0.0, 0.05]))
    filtered = {d: process_logits(logits.to(d), *(k.to(d) for k in knobs)) for d in ("cpu", "cuda")}
    torch.testing.assert_close(filtered["cuda"].cpu(), filtered["cpu"])
    rows = [torch.Generator(CUDA).manual_seed(i) for i in range(3)]
    ids = sample(filtered["cuda"], torch.Generator(CUDA).manual_seed(9), rows)
    assert ids.device.type == "cuda" and bool(torch.isfinite(filtered["cuda"].gather(-1, ids[:, None])).all())
    assert ids[0] == logits[0].argmax()  # the greedy row
    assert fused_sample(logits.cuda(), 1.0, 0, 1.0, 0.0) is None  # the C sampler is CPU-only
    torch.testing.assert_close(token_logprobs(logits.cuda(), ids, knobs[0].cuda()).cpu(),
                               token_logprobs(logits, ids.cpu(), knobs[0]))  # fmt: skip


def test_kv_cache_budget_on_cuda_is_a_quarter_of_the_free_memory() -> None:
    free, _ = torch.cuda.mem_get_info(CUDA)
    assert default_budget_bytes(CUDA) == pytest.approx(free / 4, rel=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_logprobs_on_cuda_equal_the_cpu(dtype: torch.dtype) -> None:
    logits = torch.randn(2, 300, 50_000, generator=torch.Generator().manual_seed(1)).to(dtype)
    targets = torch.randint(0, 50_000, (2, 299), generator=torch.Generator().manual_seed(2))
    results = []
    for device in ("cpu", "cuda"):
        x = logits.to(device).detach().clone().requires_grad_()  # a fresh leaf on each device
        logp, entropy = vocab_logprobs(x, targets.to(device), 0.9)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        results.append(tuple(t.float().cpu() for t in (logp, entropy, x.grad)))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(results[1], results[0], atol=tol, rtol=tol)


def test_shared_prompt_forward_on_cuda_equals_the_plain_forward(cpu_model: torch.nn.Module) -> None:
    model = on_cuda(cpu_model)
    batch = shared_prompt_batch().to(CUDA)
    outs = {}
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        logp, _ = batch_logprobs(model, batch, 1.0, shared_prefix=shared)
        (logp * batch.mask).sum().backward()
        outs[shared] = (logp * batch.mask, [p.grad.clone() for p in model.parameters()])
    assert token_logprobs_shared(model, batch.input_ids, batch.attention_mask, batch.prompt_lens) is not None
    torch.testing.assert_close(outs[True][0], outs[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[True][1], outs[False][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_policy_update_on_cuda_equals_the_cpu(cpu_model: torch.nn.Module, shared_prefix: bool) -> None:
    """One float32 update from a CPU batch (as rollouts collate it): the same metrics and the same parameters after
    an SGD step with lr 1 (the step is the clipped gradient, so gradients are compared through it)."""
    trainer = TrainerConfig(shared_prefix=shared_prefix, micro_batch_size=2, mini_batches=2)
    results = []
    for device in ("cpu", "cuda"):
        policy = copy.deepcopy(cpu_model).to(device)
        optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        setup = LossSetup.from_config(AlgorithmConfig(), trainer, 1.0)
        metrics = policy_update(policy, None, shared_prompt_batch(), setup, optimizer, scheduler)
        results.append((metrics, [p.detach().cpu() for p in policy.parameters()]))
    (cpu_metrics, cpu_params), (cuda_metrics, cuda_params) = results
    assert cuda_metrics == pytest.approx(cpu_metrics, rel=1e-3, abs=1e-5)
    torch.testing.assert_close(cuda_params, cpu_params, atol=1e-5, rtol=1e-4)


def test_bf16_mixed_update_on_cuda_follows_float32(cpu_model: torch.nn.Module) -> None:
    grads = []
    for autocast in (None, torch.bfloat16):
        policy = on_cuda(cpu_model)
        optimizer, scheduler = build_optimizer(policy, OptimizerConfig(lr=1e-4))
        setup = LossSetup.from_config(AlgorithmConfig(), TrainerConfig(micro_batch_size=2), 1.0, autocast=autocast)
        metrics = policy_update(policy, None, shared_prompt_batch(), setup, optimizer, scheduler)
        assert metrics["health/skipped_steps"] == 0
        grads.append(metrics["policy/grad_norm"])
    assert grads[1] == pytest.approx(grads[0], rel=0.05)


def test_sft_on_cuda_lowers_the_loss(cpu_model: torch.nn.Module) -> None:
    model = on_cuda(cpu_model)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=3e-3))
    examples = [(list(range(10, 40)), [0] * 10 + [1] * 20), (list(range(50, 70)), [0] * 5 + [1] * 15)]
    losses = [sft_update(model, examples, 0, optimizer, scheduler, 1.0)["sft/loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_critic_on_cuda_fits_its_returns(tiny_model_dir: Path) -> None:
    critic = Critic.from_config(ModelConfig(path=str(tiny_model_dir), device="cuda"), CriticConfig(), 2)
    batch = shared_prompt_batch()
    values = critic.values(batch)
    assert values.device.type == "cpu" and values.shape == batch.mask.shape
    batch.values, batch.returns = values, batch.mask * 0.5
    losses = [critic.update(batch)["critic/loss"] for _ in range(20)]
    assert losses[-1] < losses[0]


def rl_argv(tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    """A short `thermik rl` on reverse_text prompts on the GPU, float32, the guards checking every sync."""
    return [
        "rl", "--name", name, "--output_dir", str(tmp_path), "--model.path", str(model_dir), "--model.device", "cuda",
        "--env.name", "reverse_text", "--env.max_turns", "1", "--rollout.max_generate_length", "12",
        "--rollout.max_input_length", "128", "--rollout.max_sequence_length", "160", "--trainer.prompts_per_step", "4",
        "--trainer.group_size", "4", "--eval.size", "8", "--monitor.progress", "false",
        "--guards.parity_every", "1", "--guards.parity_max_abs_diff", "0.01", *extra,
    ]  # fmt: skip


def test_thermik_rl_on_cuda_syncs_weights_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    precision = ("--inference.precision", "float32", "--model.train_precision", "float32")
    argv = rl_argv(tmp_path, tiny_model_dir, "cuda-rl", "--checkpoint.every", "1", *precision)
    first = run_thermik(*argv, "--trainer.steps", "2", timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_thermik(*argv, "--trainer.steps", "3", "--checkpoint.resume", "true", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "cuda-rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["mismatch/logprob_abs_diff"] < 1e-3 and r["guards/parity_max_abs_diff"] < 1e-2 for r in steps)


def test_thermik_rl_on_cuda_in_bf16_with_lora(tmp_path: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("peft")
    argv = rl_argv(tmp_path, tiny_model_dir, "cuda-lora", "--trainer.steps", "2", "--lora.enabled", "true")
    proc = run_thermik(*argv, "--guards.parity_max_abs_diff", "0.5", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bf16-mixed" in proc.stderr and "bfloat16" in proc.stderr  # "auto" on a bf16 GPU, said on stderr


def test_thermik_sft_on_cuda(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = run_thermik("synthesize", "--env", "calculator", "--n", "64", "--out", str(tmp_path / "data"))
    assert data.returncode == 0, data.stderr[-2000:]
    proc = run_thermik(
        "sft", "--name", "cuda-sft", "--output_dir", str(tmp_path), "--model.path", str(tiny_model_dir),
        "--model.device", "cuda", "--train_path", str(tmp_path / "data" / "sft.jsonl"), "--max_steps", "6",
        "--batch_size", "8", "--eval_every", "3", "--eval_size", "4", "--env.name", "calculator", "--progress", "false",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "cuda-sft" / "sft_result.json").read_text())["steps"] == 6
    assert (tmp_path / "cuda-sft" / "model" / "model.safetensors").is_file()


def test_decode_graphs_on_cuda_equal_the_eager_step_and_survive_a_weight_update(cpu_model: torch.nn.Module) -> None:
    """The engine's default on a GPU replays its decode step as CUDA graphs: greedy tokens and logprobs equal the same
    step run eagerly, before and after an in-place weight update, which re-uses the graphs (no new capture)."""
    engines = {
        mode: embedded_engine(on_cuda(cpu_model), "bfloat16", eos_token_ids=[EOS], pad_token_id=0, decode_graphs=mode)
        for mode in ("capture", "eager")
    }
    graphs = engines["capture"].graphs
    assert graphs is not None and graphs.mode == "capture"
    greedy = [SamplingParams(max_tokens=16, temperature=0.0)] * len(PROMPTS)
    before = {mode: e.generate_batch(PROMPTS, greedy) for mode, e in engines.items()}
    captures, replays = graphs.captures, graphs.replays
    assert captures > 0 and replays > 0
    new = {k: v * 1.02 for k, v in cpu_model.state_dict().items()}
    after = {}
    for mode, engine in engines.items():
        assert engine.update_weights_sync(new) == 1
        after[mode] = engine.generate_batch(PROMPTS, greedy)
        asyncio.run(engine.close())
    assert graphs.captures == captures and graphs.replays > replays  # re-used, not re-captured
    for results in (before, after):
        for ours, eager in zip(results["capture"], results["eager"], strict=True):
            assert ours.token_ids == eager.token_ids
            assert max(abs(a - b) for a, b in zip(ours.logprobs, eager.logprobs, strict=True)) <= 1e-3
    assert [g.logprobs for g in after["capture"]] != [g.logprobs for g in before["capture"]]  # the new weights
    assert all(g.weight_versions == [1] * len(g.token_ids) for g in after["capture"])

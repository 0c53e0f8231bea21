"""The bfloat16 embedded engine (kernels, prepacked projections, logprobs) and the precision selection."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest
import torch
from test_embedded_engine import PAD, PROMPTS, tiny_model
from transformers import PreTrainedModel

from tests.conftest import needs_bf16
from thermik.cpu import engine_precision as precision
from thermik.cpu import isa
from thermik.cpu import kernels as cpu_kernels
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import EmbeddedEngine, embedded_engine
from thermik.inference.native_model import NativeCausalLM

kernels = cpu_kernels.load()
needs_kernels = pytest.mark.skipif(kernels is None, reason="no C compiler: the decode kernels could not be built")
U = 2.0**-8  # bfloat16's unit roundoff: 8 significant bits, round to nearest


def bf16(model: PreTrainedModel) -> PreTrainedModel:
    return copy.deepcopy(model).to(torch.bfloat16)


def engine_and_references(arch: str) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], float]:
    """Sampled tokens' logprobs of a bfloat16 engine, of transformers' bfloat16 forward and of its float32 forward
    on the same tokens; and the largest |logit| seen."""
    base = tiny_model(arch)
    engine = EmbeddedEngine(bf16(base), eos_token_ids=[], pad_token_id=PAD)
    assert engine.native.dtype == torch.bfloat16 and (kernels is None or engine.native.kernels is not None)
    params = [SamplingParams(max_tokens=24, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    gens = engine.generate_batch(PROMPTS, params)
    asyncio.run(engine.close())
    hf16, ours, ref16, ref32, top = bf16(base), [], [], [], 0.0
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ids, tokens = torch.tensor([prompt + gen.token_ids]), torch.tensor(gen.token_ids)[:, None]
        at = slice(len(prompt) - 1, len(prompt) - 1 + len(gen.token_ids))
        with torch.no_grad():
            z16, z32 = hf16(ids).logits[0, at].float(), base(ids).logits[0, at]
        top = max(top, float(z16.abs().max()))
        ours.append(torch.tensor(gen.logprobs))
        ref16.append(z16.log_softmax(-1).gather(-1, tokens)[:, 0])
        ref32.append(z32.log_softmax(-1).gather(-1, tokens)[:, 0])
    return [torch.cat(x) for x in (ours, ref16, ref32)] + [top]  # type: ignore[return-value]


@needs_bf16
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_bf16_logprobs_match_transformers_bf16_forward(arch: str) -> None:
    """Tolerance from bfloat16's precision. Each rounding to bfloat16 has relative error at most u = 2^-8. Both
    sides round the final logits z to bfloat16, |dz| <= u |z|; a log-softmax value z_t - logsumexp(z) moves by at
    most |dz_t| + max |dz| <= 2 u max|z| under such a perturbation. The two implementations round at different
    places (ours: float32 norms, RoPE and attention scores, fused bias; transformers: bfloat16 elementwise ops), so
    their logprobs may differ by the sum of both errors: 4 u max|z| for the largest difference. The earlier
    roundings (one per residual add, per projection) reach the output damped by the final norm and are of the
    same order (measured: max 0.031, mean 0.006 at max|z| = 3.5); the mean difference must stay within u max|z|.
    And the engine must be no less accurate than transformers' own bfloat16 forward: its mean distance to the
    float32 logprobs is at most 1.5x transformers' bfloat16 one (measured 0.92x to 0.97x)."""
    ours, ref16, ref32, top = engine_and_references(arch)
    diff = (ours - ref16).abs()
    assert diff.max() <= 4 * U * top, f"max {diff.max():.4f} > {4 * U * top:.4f}"
    assert diff.mean() <= U * top, f"mean {diff.mean():.4f} > {U * top:.4f}"
    assert (ours - ref32).abs().mean() <= 1.5 * (ref16 - ref32).abs().mean()


@needs_bf16
@needs_kernels
def test_bf16_rms_norm_kernel_rounds_like_transformers() -> None:
    x, w = torch.randn(7, 96).bfloat16(), torch.randn(96).bfloat16()
    xf = x.float()
    ref = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()  # LlamaRMSNorm in bfloat16
    assert torch.equal(kernels.rms_norm(x, w, 1e-6), ref)


@needs_bf16
@needs_kernels
@pytest.mark.parametrize(("dim", "group"), [(16, 3), (64, 3), (64, 5), (128, 1), (128, 8)])
def test_bf16_decode_attention_matches_float32_softmax(dim: int, group: int) -> None:
    """Queries rounded to bfloat16 attend in float32: only the output's rounding (relative u) remains. Head sizes
    and query groups with a specialised kernel (64, 128; 1-4, 6, 8) and without."""
    batch, kv_heads, max_len = 5, 2, 40
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(8, kv_heads, max_len, dim, generator=gen).bfloat16() for _ in range(2))
    q = (torch.randn(batch, kv_heads * group, dim, generator=gen) * dim**-0.5).bfloat16()
    slots, lengths = torch.tensor([3, 0, 7, 1, 5]), torch.tensor([40, 1, 17, 30, 9])
    out = kernels.decode_attention(q, (keys, values), slots, lengths)
    for b in range(batch):
        k, v = keys[slots[b], :, : lengths[b]].float(), values[slots[b], :, : lengths[b]].float()
        qb = q[b].float().view(kv_heads, group, dim)
        ref = ((qb @ k.transpose(1, 2)).softmax(-1) @ v).reshape(kv_heads * group, dim)
        torch.testing.assert_close(out[b].float(), ref, atol=1e-5, rtol=U)


@needs_bf16
@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_bf16_fused_decode_step_is_close_to_the_pytorch_path(arch: str) -> None:
    """Prefill, then a decode step at ragged positions, with and without the kernels (bfloat16 both ways): the
    kernels round less often, so the logits agree to a few bfloat16 roundings of their size."""
    native = NativeCausalLM(bf16(tiny_model(arch)))
    batch, zeros = 4, torch.zeros(4, dtype=torch.long)
    prompt = torch.randint(2, 300, (batch, 9), generator=torch.Generator().manual_seed(0))
    step, starts, slots = torch.tensor([[3], [50], [7], [299]]), torch.tensor([9, 8, 6, 9]), torch.tensor([5, 1, 0, 3])
    logits = []
    for fused in (kernels, None):
        native.kernels = fused
        cache = native.new_cache(8, 32)
        native.forward(prompt, slots, zeros, torch.full((batch,), 8), cache)
        logits.append(native.forward(step, slots, starts, zeros, cache))
    scale = float(logits[1].abs().max())
    torch.testing.assert_close(logits[0], logits[1], atol=8 * U * scale, rtol=0)


@needs_bf16
@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_bf16_prefill_through_the_kernels_matches_the_padded_forward(arch: str) -> None:
    """A bfloat16 prefill runs its rows' real tokens flattened through the decode kernels: ragged rows, a second
    chunk continuing each row's cached prefix from a different position, then a decode step. Logits agree with the
    padded PyTorch forward (mask, no kernels) to a few bfloat16 roundings, and the padding is never computed: a
    row's logits do not depend on what pads it."""
    native = NativeCausalLM(bf16(tiny_model(arch)))
    gen = torch.Generator().manual_seed(1)
    slots, zeros = torch.tensor([6, 2, 0, 5]), torch.zeros(4, dtype=torch.long)
    first, first_last = torch.randint(2, 300, (4, 11), generator=gen), torch.tensor([10, 3, 7, 0])
    second, second_last = torch.randint(2, 300, (4, 6), generator=gen), torch.tensor([5, 0, 2, 4])
    step = torch.randint(2, 300, (4, 1), generator=gen)
    logits = []
    for fused in (kernels, None):
        native.kernels = fused
        cache = native.new_cache(8, 32)
        out = [native.forward(first, slots, zeros, first_last, cache)]
        out.append(native.forward(second, slots, first_last + 1, second_last, cache))
        out.append(native.forward(step, slots, first_last + second_last + 2, zeros, cache))
        logits.append(torch.cat(out))
    scale = float(logits[1].abs().max())
    torch.testing.assert_close(logits[0], logits[1], atol=8 * U * scale, rtol=0)
    native.kernels = kernels
    repadded = torch.where(torch.arange(11) > first_last[:, None], 1, first)
    again = native.forward(repadded, slots, zeros, first_last, native.new_cache(8, 32))
    assert torch.equal(again, logits[0][:4])


@needs_bf16
def test_bf16_engine_follows_weight_updates() -> None:
    """A float32 state dict pushed into a bfloat16 engine is cast, and the prepacked weights are refreshed."""
    other = tiny_model("qwen2", seed=1)
    engine = EmbeddedEngine(bf16(tiny_model("qwen2", seed=0)), eos_token_ids=[], pad_token_id=PAD)
    greedy = [SamplingParams(max_tokens=8, temperature=0.0)]
    before = engine.generate_batch(PROMPTS[:1], greedy)[0]
    engine.update_weights_sync(other.state_dict())
    after = engine.generate_batch(PROMPTS[:1], greedy)[0]
    fresh = EmbeddedEngine(bf16(other), eos_token_ids=[], pad_token_id=PAD).generate_batch(PROMPTS[:1], greedy)[0]
    assert after.token_ids == fresh.token_ids != before.token_ids
    assert after.logprobs == fresh.logprobs


def test_auto_precision_is_float32_when_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(precision.AUTO_PRECISION_ENV, "float32")
    dtype, reason = precision.resolve_precision("auto", torch.float32, torch.device("cpu"))
    assert dtype == torch.float32 and precision.AUTO_PRECISION_ENV in reason
    model = tiny_model("llama")
    engine = embedded_engine(model, precision="auto", eos_token_ids=[], pad_token_id=PAD)
    assert engine.native.dtype == torch.float32 and engine.native.kernels is kernels


def test_auto_precision_follows_the_cpu_level(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """ "auto" is bfloat16 exactly where the probe reports native bfloat16 dot products, float32 elsewhere."""
    monkeypatch.delenv(precision.AUTO_PRECISION_ENV, raising=False)
    for level, expected in (("avx2", torch.float32), ("avx512", torch.float32), ("avx512_bf16", torch.bfloat16)):
        caps = isa.CpuCapabilities(level=level, real_level="amx", flags=frozenset(), machine="x86_64")
        monkeypatch.setattr(precision, "capabilities", lambda caps=caps: caps)
        model = precision.apply_precision(tiny_model("qwen2"), "auto")
        assert next(model.parameters()).dtype == expected, level
        dtype = str(expected).removeprefix("torch.")
        assert f"thermik embedded engine: {dtype} (inference.precision = 'auto' and the CPU is {level} (simulated" in (
            capsys.readouterr().err
        )


def test_precision_names() -> None:
    cpu = torch.device("cpu")
    assert precision.resolve_precision("model", torch.float32, cpu)[0] == torch.float32
    if isa.capabilities().bf16_runs:
        assert precision.resolve_precision("bfloat16", torch.float32, cpu)[0] == torch.bfloat16
    else:  # asked for by name on a CPU that cannot run it: refused, naming the key (docs/cpus.md)
        with pytest.raises(ValueError, match=r"inference\.precision = 'bfloat16' needs"):
            precision.resolve_precision("bfloat16", torch.float32, cpu)
    with pytest.raises(ValueError, match="valid precisions: model, float32, bfloat16, bf16-weights, int8, auto"):
        precision.resolve_precision("fp8", torch.float32, cpu)


@pytest.fixture(scope="module")
def engine_bench():
    from tests.conftest import load_benchmark

    yield from load_benchmark("engine_vs_hf")


def test_engine_benchmark_roofline_counts_every_projection(engine_bench) -> None:
    """The roofline's matmuls are the model's linear layers, each once per token (the tied lm head included)."""
    model = tiny_model("llama")
    flops = sum(2 * k * n * count for _, k, n, count in engine_bench.projection_shapes(model))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert flops == 2 * linear
    assert engine_bench.matmul_seconds(4, 64, 96, torch.bfloat16, repeats=1) > 0


def test_engine_step_sections_tool_times_every_section(tiny_model_dir, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/engine_step_sections.py on the tiny preset: every section is timed, and the parts fit the step."""
    from tests.conftest import load_benchmark

    dtype = "bfloat16" if isa.capabilities().bf16_runs else "float32"
    argv = ["--model", str(tiny_model_dir), "--batch", "4", "--tokens", "6", "--prompt-tokens", "5"]
    argv += ["--precision", dtype]
    for tool in load_benchmark("engine_step_sections"):
        per_step = tool.main(argv)
    assert set(per_step) == set(tool.SECTIONS) and per_step["decode step"] > 0
    assert per_step["forward"] > 0 and per_step["sample+record"] > 0  # (both also count the prefill's share)
    sampling = ("fused_sample", "sample", "process_logits", "token_logprobs")
    assert 0 < sum(per_step[key] for key in sampling) <= per_step["sample+record"]
    # 6 tokens = the prefill's + 5 decode steps per request; the scheduler may admit the 4 requests in more than one
    # wave (a loaded machine), which adds steps but never removes one (the tool counts after the last step ends).
    steps = int(re.search(r"(\d+) decode steps", capsys.readouterr().out).group(1))
    assert 5 <= steps <= 4 * 5


@pytest.fixture(scope="module")
def prefill_bench():
    from tests.conftest import load_benchmark

    yield from load_benchmark("prefill_paths")


@needs_kernels
def test_prefill_benchmark_compares_both_paths_on_the_same_tokens(prefill_bench, capsys: pytest.CaptureFixture) -> None:
    """benchmarks/prefill_paths.py on a tiny bfloat16 model: both paths time the same ragged prefill after a cached
    prefix, agree to bfloat16 rounding, and the model keeps its kernels afterwards."""
    native = NativeCausalLM(bf16(tiny_model("qwen2")))
    kernels_before = native.kernels
    prefill_bench.shape_row(native, (3, 9, 5), repeats=1, seed=0)
    out = capsys.readouterr().out
    assert "3 x 9" in out and "after 5" in out
    kl = float(out.split("max KL")[1])
    assert 0 <= kl < 1e-2
    assert float(out.split("ratio")[1].split("x")[0]) > 0
    assert native.kernels is kernels_before

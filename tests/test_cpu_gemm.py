"""The packed-weight projections (cpu/gemm.py, csrc/gemm.c): float32, bfloat16-stored and int8 weights against
references on ragged shapes, and the int8 engine's logprobs and weight updates."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from test_embedded_engine import PAD, PROMPTS, tiny_model
from transformers import PreTrainedModel

from thermik.cpu import engine_precision as precision
from thermik.cpu import gemm
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import EmbeddedEngine, embedded_engine
from thermik.inference.native_model import NativeCausalLM

needs_gemm = pytest.mark.skipif(gemm.load() is None, reason="no C compiler: the gemm kernels could not be built")
pytestmark = needs_gemm
SHAPES = [(1, 4, 1), (3, 20, 17), (7, 36, 33), (13, 300, 40), (6, 520, 16), (65, 64, 100), (2, 768, 31), (261, 32, 19)]
F32_EPS = 2.0**-24


def quantize(t: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of t's rows per group of `group` as csrc/gemm.c computes them: scale = max|t| / 127,
    q = round-half-even(t * (127 / max|t|)), in float32."""
    groups = t.reshape(*t.shape[:-1], t.shape[-1] // group, group)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(groups * inv).clamp(-127, 127), amax / 127.0


def dequantized(t: torch.Tensor, group: int) -> torch.Tensor:
    q, scale = quantize(t, group)
    return (q.double() * scale.double()).reshape(t.shape)


def run(fmt: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, accumulate: bool) -> torch.Tensor:
    packed = gemm.Packed(w, fmt)
    if not accumulate:
        return packed(x, bias)
    out = torch.linspace(-1, 1, x.shape[0] * w.shape[0]).view(x.shape[0], w.shape[0]).contiguous()
    return packed(x, bias, out=out) - torch.linspace(-1, 1, out.numel()).view_as(out)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", ["float32", "bf16"])
def test_float_kernels_match_float64_on_ragged_shapes(fmt: str, shape: tuple[int, int, int]) -> None:
    """float32 arithmetic on the (bfloat16-rounded, for "bf16") weights: each output is a sum of k products, off
    the exact float64 value by at most ~k * eps * sum |x w| (a generous bound for any summation order)."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(m * 1000 + k)
    x, w, bias = (torch.randn(*s, generator=gen) for s in ((m, k), (n, k), (n,)))
    weights = w.double() if fmt == "float32" else w.bfloat16().double()
    exact = x.double() @ weights.T + bias.double()
    bound = (x.double().abs() @ weights.abs().T + bias.double().abs()) * (k + 2) * F32_EPS
    for accumulate in (False, True):
        got = run(fmt, x, w, bias, accumulate).double()
        assert ((got - exact).abs() <= bound + 4 * F32_EPS).all(), (fmt, accumulate)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] % 4 == 0])
def test_int8_kernel_matches_the_quantized_product(shape: tuple[int, int, int]) -> None:
    """The int8 product equals sum_g sx sw (qx . qw) exactly in the integers; only the float32 scaling of each
    group's sum rounds. Against the float product it is off by at most the quantization error: each factor moves
    by at most half its step (scale / 2), so |x w - x' w'| <= |x| sw/2 + |w| sx/2 + sx sw / 4 per term."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(k)
    x, w, bias = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    group = gemm.INT8_GROUP if k % gemm.INT8_GROUP == 0 else k
    assert gemm.Packed(w, "int8").group == group
    xq, wq = dequantized(x, group), dequantized(w, group)
    exact_quantized = xq @ wq.T + bias.double()
    for accumulate in (False, True):
        got = run("int8", x, w, bias, accumulate).double()
        torch.testing.assert_close(got, exact_quantized, atol=1e-4, rtol=1e-5)
    (_, sx), (_, sw) = quantize(x, group), quantize(w, group)
    step_x = sx.double().expand(m, k // group, group).reshape(m, k)
    step_w = sw.double().expand(n, k // group, group).reshape(n, k)
    bound = x.double().abs() @ step_w.T / 2 + step_x @ w.double().abs().T / 2 + step_x @ step_w.T / 4
    error = (got - (x.double() @ w.double().T + bias.double())).abs()
    assert (error <= bound + 1e-4).all()


def test_packed_weights_check_their_input() -> None:
    with pytest.raises(ValueError, match="unknown packed weight format 'int4'; valid formats: float32, bf16, int8"):
        gemm.Packed(torch.zeros(4, 4), "int4")
    with pytest.raises(ValueError, match="contiguous 2-D float32"):
        gemm.Packed(torch.zeros(4, 4, dtype=torch.bfloat16), "float32")
    with pytest.raises(ValueError, match="divisible by 4"):
        gemm.Packed(torch.zeros(4, 6), "int8")


def engine(model: PreTrainedModel, fmt: str) -> EmbeddedEngine:
    return EmbeddedEngine(copy.deepcopy(model), eos_token_ids=[], pad_token_id=PAD, weight_formats=(fmt,))


def teacher_forced(native: NativeCausalLM, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logprobs of `tokens` after `prompt` from the native forward: the prompt's prefill, then one decode step per
    token (both paths the engine runs)."""
    cache = native.new_cache(1, len(prompt) + len(tokens))
    slot, zero = torch.tensor([0]), torch.tensor([0])
    logits = [native.forward(torch.tensor([prompt]), slot, zero, torch.tensor([len(prompt) - 1]), cache)]
    for i, token in enumerate(tokens[:-1]):
        logits.append(native.forward(torch.tensor([[token]]), slot, torch.tensor([len(prompt) + i]), zero, cache))
    return torch.cat(logits).log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_int8_logprobs_stay_within_the_quantization_noise_of_float32(arch: str) -> None:
    """Tolerance from the quantization step: moving every projection weight of the float32 model by uniform noise of
    up to half its int8 step (the rounding int8 makes) changes the sampled tokens' logprobs by some mean amount d;
    the int8 forward (which also rounds the activations, to the same relative step) must stay within 3 d of float32
    on average and within 10 d on every token (measured: 1.3 d and 5 d); the packed float32 forward within float32
    rounding."""
    base = tiny_model(arch)
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(3, 200, (12,), generator=gen).tolist() for _ in PROMPTS]

    def logprobs(model: PreTrainedModel, fmt: str) -> torch.Tensor:
        native = NativeCausalLM(copy.deepcopy(model), (fmt,))
        assert native.weight_format == fmt
        return torch.cat([teacher_forced(native, p, t) for p, t in zip(PROMPTS, tokens, strict=True)])

    float32 = logprobs(base, "blas")
    noisy = copy.deepcopy(base)
    with torch.no_grad():
        for name, p in noisy.named_parameters():
            if name.endswith("proj.weight") or name == "lm_head.weight":
                step = quantize(p, gemm.INT8_GROUP)[1].expand(*p.shape[:-1], -1, gemm.INT8_GROUP).reshape(p.shape)
                p.add_((torch.rand(p.shape, generator=gen) - 0.5) * step)
    noise = (logprobs(noisy, "blas") - float32).abs().mean()
    int8 = logprobs(base, "int8")
    assert 0 < (int8 - float32).abs().mean() <= 3 * noise
    assert (int8 - float32).abs().max() <= 10 * noise
    torch.testing.assert_close(logprobs(base, "float32"), float32, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logprobs(base, "bf16"), float32, atol=0.1, rtol=0)  # 2^-8 relative weights


@pytest.mark.parametrize("fmt", ["int8", "bf16", "float32"])
def test_a_weight_update_repacks_the_weights(fmt: str) -> None:
    """Logprobs after a weight update equal those of a fresh engine built on the new weights (re-quantized in
    place for int8)."""
    other = tiny_model("qwen2", seed=1)
    eng = engine(tiny_model("qwen2", seed=0), fmt)
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=3)]
    before = eng.generate_batch(PROMPTS[:1], params)[0]
    eng.update_weights_sync(other.state_dict())
    after = eng.generate_batch(PROMPTS[:1], params)[0]
    fresh_engine = engine(other, fmt)
    fresh = fresh_engine.generate_batch(PROMPTS[:1], params)[0]
    for e in (eng, fresh_engine):
        asyncio.run(e.close())
    assert after.token_ids == fresh.token_ids and after.logprobs == fresh.logprobs
    assert after.logprobs != before.logprobs


def test_precisions_choose_projection_formats(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert precision.projection_formats("int8", torch.float32, cpu) == ("int8",)
    assert precision.projection_formats("bf16-weights", torch.float32, cpu) == ("bf16",)
    monkeypatch.delenv(precision.AUTO_PRECISION_ENV, raising=False)
    assert precision.projection_formats("auto", torch.float32, cpu) == ("blas", "float32", "bf16")
    monkeypatch.setenv(precision.AUTO_PRECISION_ENV, "float32")
    assert precision.projection_formats("auto", torch.float32, cpu) == ("blas",)
    assert precision.projection_formats("auto", torch.bfloat16, cpu) == ("blas",)
    assert precision.projection_formats("model", torch.float32, cpu) == ("blas",)
    assert precision.resolve_precision("int8", torch.bfloat16, cpu)[0] == torch.float32
    eng = embedded_engine(tiny_model("llama"), precision="int8", eos_token_ids=[], pad_token_id=PAD)
    assert eng.native.weight_format == "int8" and eng.native.dtype == torch.float32
    assert "projection weights int8" in capsys.readouterr().err
    asyncio.run(eng.close())
    eng = embedded_engine(tiny_model("llama"), precision="float32", eos_token_ids=[], pad_token_id=PAD)
    assert (eng.native.weight_format, eng.native.format_times) == ("blas", {})  # small models: untimed
    asyncio.run(eng.close())
    monkeypatch.setattr(gemm, "TIMED_MIN_BYTES", 0)
    eng = embedded_engine(tiny_model("llama"), precision="float32", eos_token_ids=[], pad_token_id=PAD)
    timed = eng.native.format_times
    assert set(timed) == ({"blas", "float32"} if gemm.available() else set())
    assert eng.native.weight_format == (min(timed, key=timed.__getitem__) if timed else "blas")
    asyncio.run(eng.close())

"""EmbeddedEngine and the sampling functions, checked against HF generate and full forward passes on tiny models."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from thermik.cpu import kernels as cpu_kernels
from thermik.inference.base import Generation, SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.sampling import fused_sample, process_logits, sample, token_logprobs

VOCAB = 300
PAD = 0
EOS = 1
PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [8, 9], [120, 121, 122, 123], [77]]


def tiny_model(arch: str, seed: int = 0) -> PreTrainedModel:
    """A ~100k-parameter model; initializer_range 0.1 so outputs are far from uniform."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        initializer_range=0.1,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, head_dim=16)).eval()
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16)).eval()
    raise ValueError(f"unknown arch {arch!r}")


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def model(request: pytest.FixtureRequest) -> PreTrainedModel:
    return tiny_model(request.param)


@pytest.fixture(scope="module")
def qwen() -> PreTrainedModel:
    return tiny_model("qwen2")


def make_engine(model: PreTrainedModel, **kwargs: object) -> EmbeddedEngine:
    return EmbeddedEngine(model, eos_token_ids=[EOS], pad_token_id=PAD, **kwargs)


def hf_greedy(model: PreTrainedModel, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Reference: left-padded batched model.generate, each row cut after its first EOS."""
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return rows


def reference_logprobs(model: PreTrainedModel, prompt: list[int], gen: Generation, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each generated token from one unpadded forward over prompt + generation."""
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = (logits / temperature).log_softmax(-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(gen.token_ids))
    return logp[positions, torch.tensor(gen.token_ids)]


# ---------------------------------------------------------------- sampling functions


def test_process_logits_per_row_params_match_rows_processed_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    temps, ks, ps, mps = [0.0, 0.7, 1.3, 1.0], [0, 5, 0, 3], [1.0, 0.9, 0.5, 1.0], [0.0, 0.0, 0.1, 0.2]
    batched = process_logits(logits, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps), torch.tensor(mps))
    for i in range(4):
        alone = process_logits(logits[i : i + 1], temps[i], ks[i], ps[i], mps[i])
        torch.testing.assert_close(batched[i : i + 1], alone)


def test_process_logits_filters_by_hand() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda out: (out[0] > float("-inf")).tolist()  # noqa: E731
    assert kept(process_logits(logits, top_k=2)) == [True, True, False, False]
    # top-p 0.8: 0.5 + 0.3 reaches 0.8, so the third token is dropped; 0.81 needs the third one too.
    assert kept(process_logits(logits, top_p=0.8)) == [True, True, False, False]
    assert kept(process_logits(logits, top_p=0.81)) == [True, True, True, False]
    # min-p 0.2: threshold 0.1 drops only the 0.05 token.
    assert kept(process_logits(logits, min_p=0.2)) == [True, True, True, False]
    assert kept(process_logits(logits, temperature=0.0)) == [True, False, False, False]
    torch.testing.assert_close(process_logits(logits, temperature=0.5), logits / 0.5)


def test_process_logits_rejects_bad_params() -> None:
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="top_p"):
        process_logits(logits, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        process_logits(logits, temperature=-1.0)
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        process_logits(logits, temperature=torch.ones(3))


def test_sample_frequencies_match_probabilities() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(40_000, 4)
    ids = sample(logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=4).float() / ids.numel()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    # Filtered tokens are never drawn.
    ids = sample(process_logits(logits, top_k=2), torch.Generator().manual_seed(1))
    assert set(ids.tolist()) == {2, 3}


@pytest.mark.parametrize("vocab", [100, 49152])
def test_sample_row_generator_is_independent_of_other_rows(vocab: int) -> None:
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(0))
    seeded = [None] * 9
    for row in (1, 8):
        alone = [sample(logits[row : row + 1], row_generators=[torch.Generator().manual_seed(7)]) for _ in range(2)]
        seeded[row] = torch.Generator().manual_seed(7)
        mixed = sample(logits, torch.Generator().manual_seed(99), seeded)
        seeded[row] = None
        assert alone[0].item() == alone[1].item() == mixed[row].item()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sample_is_an_exact_categorical_draw_across_blocks() -> None:
    """The two-level inverse CDF draws from the distribution itself, also at block edges and in the tail.

    Vocab 1000 = three 256-token blocks and a 232-token tail; mass sits on both sides of each block edge, on the
    last token and spread thinly over the rest; tokens 1-9 are filtered out (-inf). 20k seeded draws, Pearson's
    chi-square over 8 cells (df 7) against its 1e-4 critical value 29.88: a sampler off by one token at a block
    edge, or one ignoring the tail block, gives statistics in the thousands.
    """
    vocab, named = 1000, [0, 255, 256, 511, 767, 768, 999]
    mass = torch.tensor([0.1, 0.15, 0.05, 0.2, 0.1, 0.1, 0.2])
    probs = torch.zeros(vocab, dtype=torch.float64)
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[named], rest[1:10] = False, False
    probs[named], probs[rest] = mass.double(), 0.1 / int(rest.sum())
    logits = probs.log().float().expand(5000, vocab)
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([sample(logits, gen) for _ in range(4)])
    counts = torch.bincount(ids, minlength=vocab).double()
    assert counts[1:10].sum() == 0  # zero-probability tokens are never drawn
    cells = torch.cat([counts[named], counts[rest].sum().view(1)])
    assert _chi_square(cells, torch.cat([mass.double(), torch.tensor([0.1], dtype=torch.float64)])) < 29.88
    assert 0.5 * (cells / cells.sum() - torch.cat([probs[named], probs[rest].sum().view(1)])).abs().sum() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1000, 49152])
def test_fused_sample_draws_what_sample_draws(dtype: torch.dtype, vocab: int) -> None:
    """The C sampler of the plain setting: the same uniforms from the same generators give the same tokens as
    process_logits + sample, and the logprobs of token_logprobs."""
    if cpu_kernels.load_vocab() is None:
        pytest.skip("no C compiler: the vocabulary kernels could not be built")
    logits = (3 * torch.randn(32, vocab, generator=torch.Generator().manual_seed(0))).to(dtype)
    ids, logp = fused_sample(logits, 0.7, 0, 1.0, 0.0, None, [torch.Generator().manual_seed(i) for i in range(32)])
    expected = sample(process_logits(logits, 0.7), None, [torch.Generator().manual_seed(i) for i in range(32)])
    assert torch.equal(ids, expected)
    torch.testing.assert_close(logp, token_logprobs(logits, expected, 0.7), atol=5e-5, rtol=0)


def test_fused_sample_is_an_exact_categorical_draw_and_only_for_the_plain_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused sampler on the block-edge distribution of the test above (tokens 1-9 at -inf never drawn); a
    filter, a greedy row or THERMIK_CPU_KERNELS=0 leave it to the PyTorch path (None)."""
    if cpu_kernels.load_vocab() is None:
        pytest.skip("no C compiler: the vocabulary kernels could not be built")
    probs = torch.full((1000,), 0.5 / 986, dtype=torch.float64)  # 986 = 1000 - 9 masked - 5 named tokens
    probs[1:10], probs[[0, 255, 256, 511, 999]] = 0.0, 0.1
    logits = probs.log().float().expand(20_000, 1000)
    ids, logp = fused_sample(logits, 1.0, 0, 1.0, 0.0, torch.Generator().manual_seed(0))
    counts = torch.bincount(ids, minlength=1000).double()
    assert counts[1:10].sum() == 0
    cells = torch.cat([counts[[0, 255, 256, 511, 999]], (counts.sum() - counts[[0, 255, 256, 511, 999]].sum()).view(1)])
    assert _chi_square(cells, torch.tensor([0.1] * 5 + [0.5], dtype=torch.float64)) < 20.52  # df 5, p = 1e-3
    torch.testing.assert_close(logp, probs.log().float()[ids], atol=1e-5, rtol=0)
    for knobs in ((0.7, 5, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (0.7, 0, 1.0, 0.1), (0.0, 0, 1.0, 0.0)):
        assert fused_sample(logits[:2], *knobs) is None
    monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    assert fused_sample(logits[:2], 1.0, 0, 1.0, 0.0) is None


def test_sample_draws_one_uniform_per_seeded_row_and_keeps_greedy_rows_greedy() -> None:
    """A seeded row consumes exactly one float64 from its generator per step, so its stream never depends on
    the vocabulary size or the other rows; a temperature-0 row (one finite logit) always gets its argmax."""
    logits = process_logits(torch.randn(3, 700, generator=torch.Generator().manual_seed(2)), torch.tensor([1.0, 0, 1]))
    row, twin = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(3):
        ids = sample(logits, torch.Generator().manual_seed(1), [None, None, row])
        torch.rand(1, generator=twin, dtype=torch.float64)
        assert ids[1].item() == logits[1].argmax().item()
    assert torch.equal(row.get_state(), twin.get_state())


def test_token_logprobs_use_temperature_one_when_greedy() -> None:
    logits = torch.randn(2, 10)
    ids = torch.tensor([3, 4])
    out = token_logprobs(logits, ids, torch.tensor([0.0, 0.5]))
    assert out[0].item() == pytest.approx(logits[0].log_softmax(-1)[3].item(), abs=1e-6)
    assert out[1].item() == pytest.approx((logits[1] / 0.5).log_softmax(-1)[4].item(), abs=1e-6)


# ---------------------------------------------------------------- engine decoding


def test_greedy_matches_hf_generate_with_mixed_prompt_lengths(model: PreTrainedModel) -> None:
    engine = make_engine(model)
    gens = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=12, temperature=0.0)] * len(PROMPTS))
    expected = hf_greedy(model, PROMPTS, 12)
    assert [g.token_ids for g in gens] == expected
    for g in gens:
        assert g.stop_reason == ("stop" if g.token_ids[-1] == EOS else "length")
        assert g.weight_version == 0 and g.weight_versions == [0] * len(g.token_ids)
    # One batch: one prefill plus one forward per decode step.
    assert engine.num_batches == 1
    assert engine.num_forwards <= 12


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_full_forward(model: PreTrainedModel, temperature: float) -> None:
    engine = make_engine(model)
    params = SamplingParams(max_tokens=10, temperature=temperature, seed=3)
    gens = engine.generate_batch(PROMPTS, [params] * len(PROMPTS))
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        assert len(gen.logprobs) == len(gen.token_ids) > 0
        ref = reference_logprobs(model, prompt, gen, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(gen.logprobs), ref, atol=1e-4, rtol=0)


def test_stop_token_ends_only_its_row(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    free = engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=12, temperature=0.0)])[0]
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_at,)),
        SamplingParams(max_tokens=12, temperature=0.0),
    ]
    stopped, other = engine.generate_batch([PROMPTS[0], PROMPTS[1]], params)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.stop_reason == "stop"
    assert other.token_ids == hf_greedy(qwen, [PROMPTS[1]], 12)[0]


def test_max_tokens_gives_length_per_row(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, seed=1)
    # EOS is never special to this engine here, so rows can only end by length.
    engine.eos_token_ids = frozenset()
    short, long = engine.generate_batch(
        [PROMPTS[0], PROMPTS[2]],
        [SamplingParams(max_tokens=3, temperature=0.0), SamplingParams(max_tokens=9, temperature=0.0)],
    )
    assert (len(short.token_ids), short.stop_reason) == (3, "length")
    assert (len(long.token_ids), long.stop_reason) == (9, "length")
    alone = engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=9, temperature=0.0)])[0]
    assert short.token_ids == alone.token_ids[:3]


def test_seeded_row_is_reproducible_regardless_of_batch(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=1234)
    unseeded = SamplingParams(max_tokens=6, temperature=1.0)
    alone = engine.generate_batch([PROMPTS[2]], [seeded])[0]
    mixed = engine.generate_batch([PROMPTS[0], PROMPTS[2], PROMPTS[3]], [unseeded, seeded, unseeded])[1]
    assert mixed.token_ids == alone.token_ids
    assert mixed.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = engine.generate_batch([PROMPTS[2]], [SamplingParams(max_tokens=10, temperature=1.0, seed=5)])[0]
    assert other_seed.token_ids != alone.token_ids


def test_top_k_one_and_tiny_top_p_equal_greedy(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    greedy = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=8, temperature=0.0)] * 4)
    top_k = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=8, temperature=1.0, top_k=1)] * 4)
    top_p = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6)] * 4)
    assert [g.token_ids for g in top_k] == [g.token_ids for g in greedy]
    assert [g.token_ids for g in top_p] == [g.token_ids for g in greedy]
    # Logprobs ignore the filters: at temperature 1 they equal the greedy ones.
    assert top_k[0].logprobs == pytest.approx(greedy[0].logprobs, abs=1e-5)


def test_sampling_at_temperature_one_is_not_greedy(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    greedy = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=8, temperature=0.0)] * 4)
    sampled = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=8, temperature=1.0)] * 4)
    assert [g.token_ids for g in sampled] != [g.token_ids for g in greedy]


def test_bad_requests_fail_clearly(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    with pytest.raises(ValueError, match="empty"):
        engine.generate_batch([[]], [SamplingParams()])
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate_batch([[VOCAB + 1]], [SamplingParams()])
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate_batch([[3]], [SamplingParams(max_tokens=0)])


# ---------------------------------------------------------------- async API


def test_concurrent_generate_calls_are_batched(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, max_batch_size=64)
    prompts = [PROMPTS[i % 4] + [10 + i] for i in range(32)]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.0005)

    async def main() -> list[Generation]:
        stop = asyncio.Event()
        tick_task = asyncio.create_task(ticker(stop))
        gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        stop.set()
        await tick_task
        await engine.close()
        return list(gens)

    gens = asyncio.run(main())
    assert len(gens) == 32
    assert engine.num_batches < 32
    assert [g.token_ids for g in gens] == hf_greedy(qwen, prompts, 8)
    # The event loop kept running while the batch decoded in a worker thread.
    assert ticks > 1


def test_close_rejects_new_requests(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)

    async def main() -> None:
        await engine.generate(PROMPTS[1], SamplingParams(max_tokens=2))
        await engine.close()
        with pytest.raises(RuntimeError, match="closed"):
            await engine.generate(PROMPTS[1], SamplingParams(max_tokens=2))
        with pytest.raises(RuntimeError, match="closed"):
            engine.generate_batch([PROMPTS[1]], [SamplingParams(max_tokens=2)])

    asyncio.run(main())


def test_update_weights_from_state_dict_and_directory(tmp_path: Path) -> None:
    model, other = tiny_model("qwen2", seed=0), tiny_model("qwen2", seed=1)
    engine = make_engine(model)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    new_state = {k: v.clone() for k, v in other.state_dict().items()}

    async def main() -> tuple[Generation, int, Generation]:
        before = await engine.generate(PROMPTS[0], params)
        version = await engine.update_weights(new_state)
        after = await engine.generate(PROMPTS[0], params)
        return before, version, after

    before, version, after = asyncio.run(main())
    assert version == engine.weight_version == 1
    assert after.token_ids == hf_greedy(other, [PROMPTS[0]], 8)[0] != before.token_ids
    assert after.weight_version == 1 and set(after.weight_versions) == {1}

    # Back to the first weights, this time from a directory of safetensors.
    first = {k: v.clone().contiguous() for k, v in tiny_model("qwen2", seed=0).state_dict().items()}
    save_file(first, tmp_path / "model.safetensors")
    assert engine.update_weights_sync(tmp_path) == 2
    again = engine.generate_batch([PROMPTS[0]], [params])[0]
    assert again.token_ids == before.token_ids and again.weight_version == 2


def test_update_weights_rejects_unknown_and_misshaped(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    with pytest.raises(KeyError, match=r"not\.a\.weight"):
        engine.update_weights_sync({"not.a.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        engine.update_weights_sync({"lm_head.weight": torch.zeros(3, 3)})
    assert engine.weight_version == 0

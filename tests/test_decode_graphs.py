"""The fixed-shape decode step that the engine replays as CUDA graphs on a GPU (inference/decode_graphs.py), run
eagerly on the CPU: same logits as the native forward, padded rows harmless, the engine's results unchanged, weight
updates seen without rebuilding, a reallocated cache dropping its steps. tests/test_cuda.py runs the captured graphs."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from thermik.inference.base import SamplingParams
from thermik.inference.decode_graphs import BATCH_BUCKETS, DecodeGraphs, batch_bucket, span_bucket, static_decode
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.native_model import NativeCausalLM

EOS = 258
PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [8, 9], [120, 121, 122, 123], [77, 78, 79, 80, 81, 82, 83, 84, 85]]


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_buckets() -> None:
    assert [batch_bucket(n) for n in (1, 3, 64, 65, 256)] == [1, 4, 64, 96, 256]
    assert batch_bucket(BATCH_BUCKETS[-1] + 1) is None
    assert [span_bucket(n, 1024) for n in (1, 64, 65, 300)] == [64, 64, 128, 512]
    assert span_bucket(300, 256) == 256


def prefilled(model: torch.nn.Module) -> tuple[NativeCausalLM, object]:
    """A native forward over a cache whose slots 0..3 hold PROMPTS."""
    native = NativeCausalLM(copy.deepcopy(model))
    cache = native.new_cache(4, 32)
    width = max(map(len, PROMPTS))
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    last = torch.tensor([len(p) - 1 for p in PROMPTS])
    native.forward(tokens, torch.arange(4), torch.zeros(4, dtype=torch.long), last, cache)
    return native, cache


def test_static_step_equals_the_native_decode_step(model: torch.nn.Module) -> None:
    """Rows in any slot order, padded to a bucket, attending to a span past their lengths: the native step's logits,
    and the cache holds the same keys and values afterwards (the padded rows wrote only the spare position)."""
    native, cache = prefilled(model)
    native2, cache2 = prefilled(model)
    rows = [2, 0, 3]
    tokens, positions = [11, 12, 13], [len(PROMPTS[i]) for i in rows]
    want = native.forward(
        torch.tensor(tokens)[:, None], torch.tensor(rows), torch.tensor(positions), torch.zeros(3, dtype=torch.long),
        cache,
    )  # fmt: skip
    got = DecodeGraphs(native2, "eager").decode(cache2, tokens, rows, positions)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(cache.keys + cache.values, cache2.keys + cache2.values, strict=True):
        torch.testing.assert_close(b[:, :, : cache.max_len - 1], a[:, :, : cache.max_len - 1])


def test_static_step_called_directly_and_capture_needs_cuda(model: torch.nn.Module) -> None:
    native, cache = prefilled(model)
    out = static_decode(native, cache, torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([7, 2]), 16)
    assert out.shape == (2, model.config.vocab_size) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(native, "capture")


def generate(engine: EmbeddedEngine, temperature: float = 0.0) -> list:
    samplings = [SamplingParams(max_tokens=10, temperature=temperature, seed=i) for i in range(len(PROMPTS))]
    return engine.generate_batch(PROMPTS, samplings)


def test_engine_with_the_static_step_gives_the_native_engines_results(model: torch.nn.Module) -> None:
    """Greedy and seeded rows: the same tokens and logprobs (float32) with the fixed-shape step as with the native
    decode; the static step ran for every decode step."""
    engines = {
        mode: EmbeddedEngine(copy.deepcopy(model), eos_token_ids=[EOS], pad_token_id=0, decode_graphs=mode)
        for mode in ("off", "eager")
    }
    assert engines["off"].graphs is None and engines["eager"].graphs is not None
    results = {mode: generate(e) + generate(e, 1.0) for mode, e in engines.items()}
    for mode in engines:
        asyncio.run(engines[mode].close())
    for ours, ref in zip(results["eager"], results["off"], strict=True):
        assert ours.token_ids == ref.token_ids
        torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)
    assert engines["eager"].graphs._steps  # the steps it ran


def test_weight_update_is_seen_by_the_static_step(model: torch.nn.Module) -> None:
    """After an in-place update the engine's static step equals a fresh engine built on the new weights."""
    new = {k: v * 1.05 for k, v in model.state_dict().items()}
    updated = EmbeddedEngine(copy.deepcopy(model), eos_token_ids=[EOS], pad_token_id=0, decode_graphs="eager")
    generate(updated)
    steps = dict(updated.graphs._steps)
    assert updated.update_weights_sync(new) == 1
    fresh_model = copy.deepcopy(model)
    fresh_model.load_state_dict(new)
    fresh = EmbeddedEngine(fresh_model, eos_token_ids=[EOS], pad_token_id=0, decode_graphs="eager")
    ours, ref = generate(updated), generate(fresh)
    for engine in (updated, fresh):
        asyncio.run(engine.close())
    assert [g.token_ids for g in ours] == [g.token_ids for g in ref]
    assert all(g.weight_versions == [1] * len(g.token_ids) for g in ours)
    assert steps  # steps existed before the update


def test_a_reallocated_cache_drops_the_steps(model: torch.nn.Module) -> None:
    native, cache = prefilled(model)
    graphs = DecodeGraphs(native, "eager")
    graphs.decode(cache, [1], [0], [7])
    assert len(graphs._steps) == 1
    cache.ensure(8, 64)  # doubles: new buffers
    graphs.decode(cache, [1], [0], [8])
    assert len(graphs._steps) == 1 and cache.generation == 1
    with pytest.raises(ValueError, match="rows"):
        graphs.decode(cache, [1] * (BATCH_BUCKETS[-1] + 1), [0] * (BATCH_BUCKETS[-1] + 1), [1] * 257)

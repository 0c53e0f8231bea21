"""The KV cache budget (`kv_cache_gb`): the cache never holds more bytes than the budget, requests that do not fit
wait (or, alone too big, fail naming the knob), idle slots are evicted and evicted sessions re-prefill, and the
tokens are those of an engine without a budget."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import PreTrainedModel

from tests.test_embedded_engine import PROMPTS, hf_greedy, make_engine, tiny_model
from thermik.config.schema import InferenceConfig, ModelConfig
from thermik.inference.base import InProcessKVCache, SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.kv_cache import KVCacheBudgetError, SlotKVCache, available_memory_bytes, default_budget_bytes

# tiny_model("qwen2"): 2 layers x (keys + values) x 2 KV heads x 16 dims x 4 bytes (float32)
BYTES_PER_POSITION = 2 * 2 * 2 * 16 * 4


def gib(positions: int) -> float:
    """A budget of `positions` slot-positions of the tiny model, in GiB."""
    return positions * BYTES_PER_POSITION / 2**30


class Watch:
    """Records the cache's real size after every reallocation and the running rows of every decode step."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.sizes, self.running = engine, [engine.scheduler.cache.nbytes], [0]
        cache, resize, decode = engine.scheduler.cache, engine.scheduler.cache.resize, engine.decoder.step

        def watched_resize(*args: object) -> None:
            resize(*args)
            self.sizes.append(cache.nbytes)

        def watched_decode() -> None:
            self.running.append(len(engine.scheduler.running()))
            decode()

        cache.resize = watched_resize  # type: ignore[method-assign]
        engine.decoder.step = watched_decode  # type: ignore[method-assign]

    def assert_within(self, budget_bytes: int) -> None:
        cache = self.engine.scheduler.cache
        assert cache.budget_bytes == budget_bytes
        actual = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
        assert actual == cache.nbytes
        assert max(self.sizes) <= budget_bytes, (max(self.sizes), budget_bytes)


@pytest.fixture(scope="module")
def qwen() -> PreTrainedModel:
    return tiny_model("qwen2")


def test_bytes_per_position_match_the_buffers() -> None:
    for dtype, itemsize in ((torch.float32, 4), (torch.bfloat16, 2)):
        cache = SlotKVCache(30, 4, 3, 16, 64, dtype, torch.device("cpu"))  # SmolLM2-135M's shape
        assert cache.bytes_per_position == 30 * 2 * 3 * 64 * itemsize
        assert cache.nbytes == 4 * 16 * cache.bytes_per_position


def test_cache_grows_by_doubling_within_the_budget_then_exactly_then_refuses() -> None:
    cache = SlotKVCache(2, 2, 2, 8, 16, torch.float32, torch.device("cpu"), budget_bytes=60 * BYTES_PER_POSITION)
    cache.keys[0][1, :, :8] = 7.0
    cache.ensure(2, 16)  # doubling fits: 2 x 16
    assert (cache.num_slots, cache.max_len) == (2, 16)
    cache.ensure(2, 17)  # doubling (2 x 32) would not: exactly 17 positions
    assert (cache.num_slots, cache.max_len) == (2, 17)
    assert bool((cache.keys[0][1, :, :8] == 7.0).all())  # contents kept
    cache.ensure(3, 13)  # 4 slots (doubling) x 17 would not fit either: exactly 3
    assert (cache.num_slots, cache.max_len) == (3, 17)
    assert cache.nbytes == 51 * BYTES_PER_POSITION
    with pytest.raises(KVCacheBudgetError):
        cache.ensure(3, 21)
    cache.resize([1], 4, 10)  # slot 1 becomes slot 0, cut to 10 positions
    assert (cache.num_slots, cache.max_len) == (4, 10)
    assert bool((cache.keys[0][0, :, :8] == 7.0).all())


def test_tiny_budget_gives_the_tokens_of_an_unbounded_engine(qwen: PreTrainedModel) -> None:
    """24 seeded requests at once; the budget holds three of them: they run three at a time, same tokens."""
    prompts = [PROMPTS[k % 4] + [30 + k] * (k % 5) for k in range(24)]
    params = [SamplingParams(max_tokens=12 + k % 9, temperature=1.0, seed=k) for k in range(24)]
    unbounded = make_engine(qwen, kv_cache_gb=math.inf)
    budgeted = make_engine(qwen, kv_cache_gb=gib(96))
    free, watch = Watch(unbounded), Watch(budgeted)
    expected = unbounded.generate_batch(prompts, params)
    got = budgeted.generate_batch(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    watch.assert_within(96 * BYTES_PER_POSITION)
    shortest = min(len(p) + s.max_tokens for p, s in zip(prompts, params, strict=True))
    assert max(free.running) == 24
    assert max(watch.running) <= 96 // shortest  # admission held the batch to what the budget holds


def greedy(model: PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens by full forwards, with no stop token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def episodes(engine: EmbeddedEngine, count: int, turns: int) -> list[list[int]]:
    """`count` concurrent episodes of `turns` seeded turns each, sessions never ended (parked between turns)."""

    async def one(k: int) -> list[int]:
        history = [200 + k, *PROMPTS[k % 4]]
        for t in range(turns):
            sampling = SamplingParams(max_tokens=4 + (k + t) % 4, temperature=1.0, seed=100 * k + t)
            gen = await engine.generate(history, sampling, session_id=f"ep{k}")
            history = history + gen.token_ids + [11 + t, 12 + t]
        return history

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(one(k) for k in range(count))))

    return asyncio.run(main())


def test_parked_sessions_are_evicted_and_re_prefilled_with_the_same_tokens(qwen: PreTrainedModel) -> None:
    unbounded = make_engine(qwen, kv_cache_gb=math.inf)
    budgeted = make_engine(qwen, kv_cache_gb=gib(80))
    watch = Watch(budgeted)
    assert episodes(budgeted, 10, 3) == episodes(unbounded, 10, 3)
    watch.assert_within(80 * BYTES_PER_POSITION)
    # Ten parked episodes do not fit in 80 positions: evicted ones prefilled their whole history again.
    assert budgeted.num_prefill_tokens > unbounded.num_prefill_tokens
    assert len(budgeted.scheduler.slots) < 10


def test_an_evicted_session_resumes_by_re_prefilling(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, kv_cache_gb=gib(64))
    six = SamplingParams(max_tokens=6, temperature=0.0)

    async def main() -> tuple[list[int], int, list]:
        first = await engine.generate([210, *PROMPTS[0]], six, session_id="a")
        history = [210, *PROMPTS[0], *first.token_ids, 11, 12]
        # Unrelated requests that need every slot: the parked session gives its slot up.
        others = [[220 + k, *PROMPTS[1]] for k in range(7)]  # 7 x (3 + 6) positions: 7 slots of 9
        await asyncio.to_thread(engine.generate_batch, others, [six] * 7)
        assert "a" not in {s.session_id for s in engine.scheduler.slots}
        before = engine.num_prefill_tokens
        second = await engine.generate(history, six, session_id="a")
        return history, engine.num_prefill_tokens - before, second.token_ids

    history, prefilled, tokens = asyncio.run(main())
    assert prefilled == len(history)  # nothing of the session was left in the cache
    assert tokens == hf_greedy(qwen, [history], 6)[0]


def test_a_cache_length_left_by_a_long_request_shrinks_for_many_short_ones(qwen: PreTrainedModel) -> None:
    engine = EmbeddedEngine(qwen, eos_token_ids=(), pad_token_id=0, kv_cache_gb=gib(256))
    watch = Watch(engine)
    engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=100, temperature=0.0)])
    assert engine.scheduler.cache.max_len >= 100  # room for two such slots at most
    prompts = [[230 + k, *PROMPTS[2]] for k in range(8)]
    short = SamplingParams(max_tokens=10, temperature=0.0)
    gens = engine.generate_batch(prompts, [short] * 8)
    assert [g.token_ids for g in gens] == [greedy(qwen, p, 10) for p in prompts]
    assert watch.running[-1] == 8  # all eight decoded together: the length was cut to theirs
    watch.assert_within(256 * BYTES_PER_POSITION)


def test_a_padded_prefill_that_would_outgrow_the_budget_runs_in_parts(qwen: PreTrainedModel) -> None:
    """A session's next turn (long cached prefix, short new part) admitted with a long new prompt: one padded
    forward would write 48 positions into both slots (96 > 64): it runs as two forwards."""
    engine = EmbeddedEngine(qwen, eos_token_ids=(), pad_token_id=0, kv_cache_gb=gib(64))
    watch = Watch(engine)
    groups: list[int] = []
    split = engine.prefill.groups

    def watched(rows: list) -> list:
        out = split(rows)
        groups.append(len(out))
        return out

    engine.prefill.groups = watched  # type: ignore[method-assign]
    four = SamplingParams(max_tokens=4, temperature=0.0)
    session = [240 + k for k in range(20)]
    first = engine._submit([(session, four, "s")])[0].result()
    history, fresh = session + first.token_ids + [11, 12], [260 + k for k in range(24)]
    # Queued in one call, so one admission round takes both on any machine (two generate() calls are admitted in
    # separate rounds when the second arrives after the gather window's quiet interval, as on a loaded CPU).
    a, b = (f.result().token_ids for f in engine._submit([(history, four, "s"), (fresh, four, None)]))
    assert groups == [1, 2]
    assert a == greedy(qwen, history, 4)
    assert b == greedy(qwen, fresh, 4)
    watch.assert_within(64 * BYTES_PER_POSITION)


def test_a_request_too_big_for_the_budget_fails_naming_the_knob(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, kv_cache_gb=gib(64))
    too_long = SamplingParams(max_tokens=100, temperature=0.0)
    with pytest.raises(ValueError, match=r"inference\.kv_cache_gb"):  # not a request waiting forever for room
        asyncio.run(asyncio.wait_for(engine.generate(PROMPTS[0], too_long), timeout=30))
    with pytest.raises(ValueError, match="kv_cache_gb"):
        engine.generate_batch([PROMPTS[0]], [too_long])
    fits = SamplingParams(max_tokens=64 - len(PROMPTS[0]), temperature=0.0)  # exactly the budget
    assert engine.generate_batch([PROMPTS[0]], [fits])[0].token_ids == hf_greedy(qwen, [PROMPTS[0]], fits.max_tokens)[0]
    with pytest.raises(ValueError, match="kv_cache_gb must be > 0"):
        make_engine(qwen, kv_cache_gb=0.0)


def test_the_budget_flows_from_the_config_and_defaults_to_a_quarter_of_available_ram(tiny_model_dir) -> None:
    from thermik.assembly import components

    policy, chat = components.load_policy(ModelConfig(path=str(tiny_model_dir)))
    available = available_memory_bytes()
    assert available is not None and available > 2**30  # any machine that runs this suite
    for gb in (0.01, None, math.inf):
        engine = components.build_engine(policy, chat, InferenceConfig(kv_cache_gb=gb))
        try:
            budget = engine.scheduler.cache.budget_bytes
            if gb is None:  # a quarter of what was available then (other processes move it a little)
                assert budget is not None and abs(budget - available / 4) < available / 8, (budget, available)
            else:
                assert budget == (None if math.isinf(gb) else int(gb * 2**30))
        finally:
            asyncio.run(engine.close())
    assert default_budget_bytes(torch.device("cpu")) is not None


def test_a_budget_too_small_for_one_sequence_fails_at_start(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, kv_cache_gb=gib(100))
    engine.require_room(100)
    with pytest.raises(KVCacheBudgetError, match=r"cannot hold one sequence of rollout.max_sequence_length = 101 .*"
                       r"set inference.kv_cache_gb to at least"):  # fmt: skip
        engine.require_room(101)
    asyncio.run(engine.close())


def test_cli_run_with_a_too_small_budget_stops_before_sampling(tiny_model_dir, tmp_path) -> None:
    from tests.conftest import run_thermik

    res = run_thermik(
        "rl", "--model.path", str(tiny_model_dir), "--env.name", "reverse_text", "--inference.kv_cache_gb", "0.00001",
        "--rollout.max_sequence_length", "640", "--output_dir", str(tmp_path), "--monitor.progress", "false",
    )  # fmt: skip
    assert res.returncode != 0
    assert "cannot hold one sequence of rollout.max_sequence_length = 640" in res.stderr, res.stderr[-2000:]
    assert not list(tmp_path.glob("*/metrics.jsonl")) or all(
        "reward/mean" not in p.read_text() for p in tmp_path.glob("*/metrics.jsonl")
    )


def test_a_failed_admission_fails_its_requests_instead_of_losing_them(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)

    def broken(*args: object) -> None:
        raise RuntimeError("no room")

    engine.scheduler.make_room = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="no room"):
        asyncio.run(asyncio.wait_for(engine.generate(PROMPTS[0], SamplingParams(max_tokens=3)), timeout=30))


PARKED_SESSIONS = """
import asyncio, json, sys
import psutil, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from thermik.inference.base import InProcessKVCache, SamplingParams
from thermik.inference.embedded import EmbeddedEngine

torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=1024)
model = Qwen2ForCausalLM(cfg).eval()
proc = psutil.Process()
base = proc.memory_info().rss
engine = EmbeddedEngine(model, eos_token_ids=[], pad_token_id=0, kv_cache_gb=float(sys.argv[1]))
rss = []

async def main():
    for wave in range(6):  # 6 x 32 sessions of 400 prompt tokens each, all left parked
        sessions = range(32 * wave, 32 * wave + 32)
        prompts = [[(7 * s + t) % 500 + 1 for t in range(400)] for s in sessions]
        params = SamplingParams(max_tokens=8, temperature=0.0)
        await asyncio.gather(*(engine.generate(p, params, session_id=f"s{s}") for s, p in zip(sessions, prompts)))
        rss.append(proc.memory_info().rss - base)

asyncio.run(main())
print(json.dumps({"first": rss[0], "peak": max(rss), "cache": engine.scheduler.cache.nbytes}))
"""


@pytest.mark.slow
def test_many_parked_sessions_keep_resident_memory_within_the_budget() -> None:
    """192 parked sessions of ~408 positions, 8 KiB each (~640 MB if all stayed cached), arriving 32 at a time. With a
    64 MiB budget the process stops growing after the first wave: what it holds beyond the cache is the prefill's
    activations, which the allocator keeps in its free lists (55-90 MiB more than after the first wave, depending on
    how the waves' requests were grouped into prefills). Without a budget it keeps growing with the sessions (over
    1 GiB more)."""
    import json
    import subprocess
    import sys

    def rss(budget: str) -> dict[str, int]:
        argv = [sys.executable, "-c", PARKED_SESSIONS, budget]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    budget, mib = 64 * 2**20, 2**20
    bounded, unbounded = rss(str(budget / 2**30)), rss("inf")
    assert bounded["cache"] <= budget < unbounded["cache"]
    grown, grown_unbounded = bounded["peak"] - bounded["first"], unbounded["peak"] - unbounded["first"]
    assert grown < 160 * mib and grown < grown_unbounded / 5, (bounded, unbounded)  # flat: parked sessions give way
    assert bounded["peak"] < budget + 400 * mib, bounded  # budget + model (~5 MB) + one wave's prefill activations
    assert grown_unbounded > 350 * mib, unbounded  # the workload does outgrow it


def test_a_weight_update_gives_the_idle_cache_back_and_the_next_rollout_regrows_it(qwen: PreTrainedModel) -> None:
    """Synchronous RL: the cache of a step's rollouts is freed at the weight update (the trainer's memory peak does not
    add to it), and the next rollout on the same engine samples what it sampled before the (identical) update."""
    engine = make_engine(qwen, kv_cache_gb=math.inf)
    params = [SamplingParams(max_tokens=24, temperature=1.0, seed=k) for k in range(len(PROMPTS))]
    first = engine.generate_batch(PROMPTS, params)
    grown = engine.scheduler.cache.nbytes
    assert engine.update_weights_sync({k: v.clone() for k, v in qwen.state_dict().items()}) == 1
    assert engine.scheduler.slots == [] and engine.scheduler.cache.nbytes < grown / 2
    again = engine.generate_batch(PROMPTS, params)
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    assert all(g.weight_version == 1 for g in again)


def test_released_idle_cache_is_regrown_by_the_next_requests(qwen: PreTrainedModel) -> None:
    """`release_idle_cache` (a synchronous step's sampling is over) frees the cache without touching the weights."""
    engine = make_engine(qwen, kv_cache_gb=math.inf)
    assert isinstance(engine, InProcessKVCache)  # what runs/step.py tests before calling it, and runs/build.py too
    params = [SamplingParams(max_tokens=24, temperature=1.0, seed=k) for k in range(len(PROMPTS))]
    first = engine.generate_batch(PROMPTS, params)
    grown = engine.scheduler.cache.nbytes
    engine.release_idle_cache()
    assert engine.scheduler.slots == [] and engine.scheduler.cache.nbytes < grown / 2 and engine.weight_version == 0
    again = engine.generate_batch(PROMPTS, params)
    assert [g.token_ids for g in again] == [g.token_ids for g in first]

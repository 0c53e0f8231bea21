"""EmbeddedEngine scheduling: continuous batching, shared group prefill, session reuse, stop strings,
top_logprobs, in-flight weight updates, cancellation and the transformers fallback."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from tests.test_embedded_engine import EOS, PAD, PROMPTS, VOCAB, hf_greedy, make_engine, reference_logprobs, tiny_model
from thermik.inference.base import Generation, SamplingParams
from thermik.inference.embedded import MIN_SHARED_PREFIX, EmbeddedEngine, embedded_engine
from thermik.inference.hf_engine import HFEngine

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


def assert_logprobs_exact(model: PreTrainedModel, prompt: list[int], gen: Generation, temperature: float) -> None:
    expected = reference_logprobs(model, prompt, gen, temperature)
    torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0)


@pytest.fixture()
def qwen() -> PreTrainedModel:
    return tiny_model("qwen2")


def test_continuous_batching_refills_freed_slots(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, max_batch_size=2)
    lengths = [2, 9, 3, 7, 1, 5]
    prompts = [PROMPTS[i % 4] + [30 + i] for i in range(6)]
    gens = engine.generate_batch(prompts, [SamplingParams(max_tokens=n, temperature=0.0) for n in lengths])
    for prompt, n, gen in zip(prompts, lengths, gens, strict=True):
        assert gen.token_ids == hf_greedy(qwen, [prompt], n)[0]
    # Two slots, refilled as soon as a sequence ends: fewer forwards than running the pairs one after another.
    static_pairs = sum(max(lengths[i : i + 2]) for i in range(0, 6, 2))
    assert engine.num_forwards < static_pairs + 3


def test_group_of_identical_prompts_shares_one_prefill(qwen: PreTrainedModel) -> None:
    shared, separate = make_engine(qwen), make_engine(tiny_model("qwen2"), reuse_prefixes=False)
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in range(8)]
    a = shared.generate_batch([PROMPTS[0]] * 8, params)
    b = separate.generate_batch([PROMPTS[0]] * 8, params)
    assert shared.num_prefill_tokens == len(PROMPTS[0])
    assert separate.num_prefill_tokens == 8 * len(PROMPTS[0])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for gen in a:
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), reference_logprobs(qwen, PROMPTS[0], gen, 1.0), atol=1e-4, rtol=0
        )


def test_prompts_sharing_a_prefix_prefill_it_once(qwen: PreTrainedModel) -> None:
    """A step's prompts under one system prompt, admitted together into an empty cache: the shared prefix is
    forwarded once and copied; every row still generates and scores what it would alone."""
    system = [(7 * i) % 200 + 20 for i in range(MIN_SHARED_PREFIX + 4)]
    prompts = [system + tail for tail in ([5, 6, 7], [8, 9], [10, 11, 12, 13], [14])] + [[3, 4, 5]]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in range(len(prompts))]
    shared, separate = make_engine(qwen), make_engine(tiny_model("qwen2"), reuse_prefixes=False)
    a = shared.generate_batch(prompts, params)
    b = separate.generate_batch(prompts, params)
    assert shared.num_prefill_tokens == len(system) + sum(len(p) - len(system) for p in prompts[:4]) + 3
    assert separate.num_prefill_tokens == sum(map(len, prompts))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for prompt, gen in zip(prompts, a, strict=True):
        assert_logprobs_exact(qwen, prompt, gen, 1.0)
    # A prefix shorter than MIN_SHARED_PREFIX is not worth its own forward.
    short = make_engine(qwen)
    short.generate_batch([[*system[:8], 5, 6], [*system[:8], 9]], params[:2])
    assert short.num_prefill_tokens == 10 + 9 and short.num_forwards == 1 + 5


def test_session_reuse_prefills_only_new_tokens(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    observation = [11, 12, 13, 14]

    async def episode() -> tuple[list[int], list]:
        first = await engine.generate(PROMPTS[0], GREEDY, session_id="ep")
        history = PROMPTS[0] + first.token_ids + observation
        before = engine.num_prefill_tokens
        second = await engine.generate(history, GREEDY, session_id="ep")
        # The first turn's last sampled token was never fed; it and the observation are all that is new.
        assert engine.num_prefill_tokens - before == 1 + len(observation)
        return history, second

    history, second = asyncio.run(episode())
    assert second.token_ids == hf_greedy(qwen, [history], 10)[0]
    torch.testing.assert_close(
        torch.tensor(second.logprobs), reference_logprobs(qwen, history, second, 1.0), atol=1e-4, rtol=0
    )


def test_ended_sessions_free_their_slots(qwen: PreTrainedModel) -> None:
    """Episodes of the next RL step take the slots of ended ones (running rows stay dense); a parked session
    (episode not ended) keeps its slot."""
    engine = make_engine(qwen)

    async def episodes(tag: str, end: bool) -> None:
        async def one(k: int) -> None:
            await engine.generate(PROMPTS[k % 4] + [40 + k], GREEDY, session_id=f"{tag}{k}")
            if end:
                engine.end_session(f"{tag}{k}")

        await asyncio.gather(*(one(k) for k in range(4)))

    asyncio.run(episodes("a", end=True))
    assert len(engine.scheduler.slots) == 4
    asyncio.run(episodes("b", end=False))  # reuses a's four slots, then parks its sessions
    assert len(engine.scheduler.slots) == 4
    asyncio.run(episodes("c", end=True))  # b's sessions still hold theirs
    assert len(engine.scheduler.slots) == 8


def test_prompt_extending_a_finished_sequence_reuses_its_cache(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    first = engine.generate_batch([PROMPTS[2]], [GREEDY])[0]
    longer = PROMPTS[2] + first.token_ids[:3]
    before = engine.num_prefill_tokens
    gen = engine.generate_batch([longer], [GREEDY])[0]
    assert engine.num_prefill_tokens - before == 1
    assert gen.token_ids == hf_greedy(qwen, [longer], 10)[0]


def test_stop_strings_end_at_the_completing_token(qwen: PreTrainedModel) -> None:
    def detokenize(ids: list[int]) -> str:
        return "".join(chr(65 + t % 26) for t in ids)

    engine = make_engine(qwen, detokenize=detokenize)
    free = engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=12, temperature=0.0)])[0]
    text = detokenize(free.token_ids)
    stop = text[4:6]
    end = text.index(stop) + len(stop)
    gen = engine.generate_batch([PROMPTS[0]], [SamplingParams(max_tokens=12, temperature=0.0, stop=(stop,))])[0]
    assert gen.stop_reason == "stop"
    assert gen.token_ids == free.token_ids[:end]
    with pytest.raises(ValueError, match="detokenize"):
        make_engine(qwen).generate_batch([PROMPTS[0]], [SamplingParams(stop=("x",))])


def test_top_logprobs_are_the_k_most_likely_tokens(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen)
    gen = engine.generate_batch([PROMPTS[1]], [SamplingParams(max_tokens=5, temperature=0.7, top_logprobs=3, seed=1)])[
        0
    ]
    assert gen.top_logprobs is not None and len(gen.top_logprobs) == 5
    ids = torch.tensor([PROMPTS[1] + gen.token_ids])
    with torch.no_grad():
        logp = (qwen(input_ids=ids).logits[0].float() / 0.7).log_softmax(-1)
    for i, top in enumerate(gen.top_logprobs):
        expected = logp[len(PROMPTS[1]) - 1 + i].topk(3)
        assert list(top) == expected.indices.tolist()
        torch.testing.assert_close(torch.tensor(list(top.values())), expected.values, atol=1e-4, rtol=0)
    assert engine.generate_batch([PROMPTS[1]], [GREEDY])[0].top_logprobs is None


def test_weight_update_lands_between_decode_steps(qwen: PreTrainedModel) -> None:
    engine = EmbeddedEngine(qwen, eos_token_ids=(), pad_token_id=PAD)  # never stops early
    other = {k: v.clone() for k, v in tiny_model("qwen2", seed=3).state_dict().items()}
    # Long enough that the update lands mid-generation even on a loaded machine (400 tokens raced it there).
    params = SamplingParams(max_tokens=3000, temperature=1.0, seed=0)

    async def main():
        task = asyncio.create_task(engine.generate(PROMPTS[0], params))
        while engine.num_forwards < 5:
            await asyncio.sleep(0.001)
        await engine.update_weights(other)
        return await task

    gen = asyncio.run(main())
    versions = gen.weight_versions
    assert (versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1) or gen.stop_reason == "stop"


def test_cancelled_request_frees_its_slot(qwen: PreTrainedModel) -> None:
    engine = make_engine(qwen, max_batch_size=1)

    async def main():
        slow = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_tokens=10_000, temperature=1.0)))
        while engine.num_forwards < 3:
            await asyncio.sleep(0.001)
        slow.cancel()
        # With one slot, this only runs once the cancelled request has left it.
        return await asyncio.wait_for(engine.generate(PROMPTS[1], GREEDY), timeout=30)

    assert asyncio.run(main()).token_ids == hf_greedy(qwen, [PROMPTS[1]], 10)[0]


def test_unsupported_architecture_falls_back_to_transformers() -> None:
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, eos_token_id=EOS)).eval()
    with pytest.warns(UserWarning, match="falling back"):
        engine = embedded_engine(gpt2, eos_token_ids=[EOS], pad_token_id=PAD)
    assert isinstance(engine, HFEngine)
    gen = engine.generate_batch([PROMPTS[0]], [GREEDY])[0]
    assert gen.token_ids == hf_greedy(gpt2, [PROMPTS[0]], 10)[0]

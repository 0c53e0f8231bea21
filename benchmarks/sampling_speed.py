"""The engine's sampler (`thermik.inference.sampling.sample`, two-level inverse CDF, one uniform per row) against
the exponential race it replaced (argmax p / E, one Exp(1) draw per vocabulary entry), in one process.

Times both on the same [batch, vocab] float32 logits, once with one shared generator and once with a seeded
generator per row (the engine's path for requests with a seed), alternating old/new each round so background
load hits both alike, and prints the median ms per call and the ratio old/new. With `--model DIR` it also runs
the embedded engine on that model (bfloat16, `--batch` seeded requests of `--tokens` tokens, temperature 1), once
per sampler, and prints ms per decode step and ms per step in the engine's sample-and-record section.

    OMP_NUM_THREADS=1 python benchmarks/sampling_speed.py --batch 64 --vocab 49152
    OMP_NUM_THREADS=1 python benchmarks/sampling_speed.py --model /work/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from transformers import AutoModelForCausalLM

import thermik.inference.embedded as embedded
import thermik.inference.embedded.records as records
from thermik.inference.base import SamplingParams
from thermik.inference.sampling import sample


def race_sample(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    row_generators: Sequence[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """The exponential race: argmax(p / E), E = -log U, a full noise row per sequence."""
    probs = logits.float().softmax(dim=-1)
    noise = torch.empty_like(probs)
    if row_generators is None or all(g is None for g in row_generators):
        noise.uniform_(generator=generator).log_().neg_()
    else:
        shared = [i for i, g in enumerate(row_generators) if g is None]
        if shared:
            noise[shared] = torch.empty(len(shared), probs.shape[1]).uniform_(generator=generator).log_().neg_()
        for i, g in enumerate(row_generators):
            if g is not None:
                noise[i].uniform_(generator=g).log_().neg_()
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def median_ms(fn: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def compare(logits: torch.Tensor, per_row: bool, rounds: int, calls: int) -> tuple[float, float]:
    """Median ms per call of the old and the new sampler, alternating round by round."""
    batch = logits.shape[0]
    gen = torch.Generator().manual_seed(0)
    rows = [torch.Generator().manual_seed(i) for i in range(batch)] if per_row else None
    old, new = [], []
    for _ in range(rounds):
        old.append(median_ms(lambda: race_sample(logits, gen, rows), calls))
        new.append(median_ms(lambda: sample(logits, gen, rows), calls))
    return statistics.median(old), statistics.median(new)


def engine_run(engine: embedded.EmbeddedEngine, sampler: Callable, batch: int, tokens: int) -> tuple[float, float]:
    """ms per decode step of one seeded batch, and ms per step inside `SampleRecorder.record`, with `sampler`."""
    spent = []
    record = engine.records.record

    def timed(slots: list, logits: torch.Tensor) -> None:
        t0 = time.perf_counter()
        record(slots, logits)
        spent.append(time.perf_counter() - t0)

    engine.records.record, records.sample = timed, sampler
    params = [SamplingParams(max_tokens=tokens, temperature=1.0, seed=i) for i in range(batch)]
    try:
        t0 = time.perf_counter()
        engine.generate_batch([[1, 2, 3, 4 + i] for i in range(batch)], params)
        wall = time.perf_counter() - t0
    finally:
        records.sample = sample
        del engine.records.record
    return wall / tokens * 1e3, statistics.median(spent[1:]) * 1e3


def engine_compare(model_dir: str, batch: int, tokens: int, rounds: int) -> None:
    """The decode loop with the old and the new sampler, alternating; best of `rounds` per side."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.bfloat16)
    engine = embedded.EmbeddedEngine(model, eos_token_ids=(), pad_token_id=0, max_batch_size=batch, num_threads=1)
    runs: dict[str, list[tuple[float, float]]] = {"exponential race": [], "inverse CDF": []}
    try:
        engine_run(engine, sample, batch, 4)  # warm-up
        for _ in range(rounds):
            runs["exponential race"].append(engine_run(engine, race_sample, batch, tokens))
            runs["inverse CDF"].append(engine_run(engine, sample, batch, tokens))
    finally:
        asyncio.run(engine.close())
    for name, results in runs.items():
        step, section = min(results)
        print(f"engine, {name:16s}: {step:6.1f} ms per decode step, sample-and-record {section:5.1f} ms")


def main(argv: list[str] | None = None) -> list[tuple[float, float]]:
    """Print and return (old ms, new ms) for the shared-generator and the per-row-generator case."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="also time the embedded engine's decode loop on this local HF model")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per request in the engine run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logits = torch.randn(args.batch, args.vocab, generator=torch.Generator().manual_seed(1)) * 3
    sample(logits), race_sample(logits)  # warm-up
    print(f"batch {args.batch} x vocab {args.vocab}, {args.threads} thread(s), torch {torch.__version__}")
    results = []
    for per_row in (False, True):
        old, new = compare(logits, per_row, args.rounds, args.calls)
        label = "seeded generator per row" if per_row else "one shared generator    "
        print(f"{label}: exponential race {old:6.2f} ms, inverse CDF {new:5.2f} ms, ratio {old / new:4.1f}x")
        results.append((old, new))
    if args.model:
        engine_compare(args.model, args.batch, args.tokens, args.rounds)
    return results


if __name__ == "__main__":
    main()

"""The embedded engine against transformers `generate`, session reuse against re-prefilling, weight-update cost.

One process, one freshly initialised preset model (thermik.models.presets.init_model), three measurements:

1. Throughput: `--batch` prompts, exactly `--max-tokens` sampled tokens each (no eos stop on either side),
   temperature 1, no top-k/top-p. transformers: `model.generate(do_sample=True, min_new_tokens=max_new_tokens)`
   on the left-padded batch. thermik: `EmbeddedEngine.generate_batch`. Tokens/s = batch * max_tokens / wall time.
2. Multi-turn: `--batch` concurrent 3-turn episodes (a `--context`-token prompt, `--turn-tokens` sampled
   tokens per turn, then a `--obs-tokens`-token observation), on the same engine with prefix/session reuse
   and with `reuse_prefixes=False` (every turn prefills the whole history).
3. Weight update: `engine.update_weights_sync(state_dict)` (checks names and shapes, copies in place, bumps the
   version) against a plain loop of `param.copy_(tensor)` over the same state dict.

Each measurement alternates the two sides `--repeats` times (so background load hits both alike) and reports
the best run of each; the ratio is ours over the baseline's speed.

    python benchmarks/engine_vs_hf.py --preset qwen2-5m --batch 64 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from thermik.inference.base import SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.models.presets import PRESETS, init_model

PAD = 0


def best_of(repeats: int, sides: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Run the sides alternately `repeats` times; best wall time of each (after one warm-up call each)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in times.items()}


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (length - (i % 7),), generator=gen).tolist() for i in range(batch)]


def hf_generate(model: PreTrainedModel, batch: list[list[int]], max_tokens: int) -> None:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), PAD)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=PAD,
        )
    assert out.shape[1] == width + max_tokens


def throughput(model: PreTrainedModel, args: argparse.Namespace) -> None:
    batch = prompts(args.batch, args.prompt_tokens, model.config.vocab_size, args.seed)
    engine = EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD, max_batch_size=args.batch)
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0)] * len(batch)

    def ours() -> None:
        gens = engine.generate_batch(batch, params)
        assert all(len(g.token_ids) == args.max_tokens for g in gens)

    hf_side = lambda: hf_generate(model, batch, args.max_tokens)  # noqa: E731
    best = best_of(args.repeats, {"transformers generate": hf_side, "thermik": ours})
    tokens = args.batch * args.max_tokens
    hf, th = tokens / best["transformers generate"], tokens / best["thermik"]
    print(f"throughput ({args.preset}, batch {args.batch}, {args.max_tokens} sampled tokens, best of {args.repeats}):")
    print(f"  transformers generate {hf:8.0f} tok/s   thermik embedded {th:8.0f} tok/s   ratio {th / hf:.2f}x")


async def episode(engine: EmbeddedEngine, context: list[int], args: argparse.Namespace, k: int) -> int:
    history = list(context)
    params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0)
    for turn in range(3):
        gen = await engine.generate(history, params, session_id=f"ep{k}")
        history += gen.token_ids + [(k * 31 + turn * 7 + j) % 200 + 1 for j in range(args.obs_tokens)]
    return len(history)


def multi_turn(model: PreTrainedModel, args: argparse.Namespace) -> None:
    contexts = prompts(args.batch, args.context, model.config.vocab_size, args.seed + 1)
    engines = {
        "re-prefill every turn": EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD, reuse_prefixes=False),
        "session reuse": EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD),
    }

    def run(engine: EmbeddedEngine) -> Callable[[], None]:
        async def all_episodes() -> None:
            await asyncio.gather(*(episode(engine, c, args, k) for k, c in enumerate(contexts)))

        return lambda: asyncio.run(all_episodes())

    best = best_of(args.repeats, {name: run(e) for name, e in engines.items()})
    base, ours = best["re-prefill every turn"], best["session reuse"]
    print(
        f"3-turn episodes ({args.batch} concurrent, {args.context}-token prompt, {args.turn_tokens} tokens/turn, "
        f"{args.obs_tokens}-token observations):"
    )
    print(f"  re-prefill every turn {base:6.2f} s   session reuse {ours:6.2f} s   ratio {base / ours:.2f}x")


def weight_update(model: PreTrainedModel, args: argparse.Namespace) -> None:
    engine = EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = model.state_dict()

    @torch.no_grad()
    def plain_copy() -> None:
        for name, tensor in state.items():
            params[name].copy_(tensor)

    times: dict[str, list[float]] = {"state_dict copy": [], "engine.update_weights": []}
    sides = {"state_dict copy": plain_copy, "engine.update_weights": lambda: engine.update_weights_sync(state)}
    for _ in range(args.repeats * 10):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base, ours = (statistics.median(times[n]) * 1e3 for n in sides)
    print(f"weight update ({sum(t.numel() for t in state.values()) / 1e6:.1f}M values, median of {args.repeats * 10}):")
    print(f"  state_dict copy {base:7.2f} ms   engine.update_weights {ours:7.2f} ms   ratio {ours / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=384, help="prompt tokens of each multi-turn episode")
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--obs-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("throughput", "multi_turn", "weight_update"), nargs="*")
    args = parser.parse_args()
    if args.batch < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--batch, --max-tokens and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, fn in (("throughput", throughput), ("multi_turn", multi_turn), ("weight_update", weight_update)):
        if not args.only or name in args.only:
            fn(model, args)


if __name__ == "__main__":
    main()

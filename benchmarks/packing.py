"""SFT forward+backward on a batch of mixed lengths: packed rows (training/packing.py) against the padded batch.

One process, one model (a local HF checkpoint with --model, else a freshly initialised preset), one batch of
`--batch` conversations whose lengths are drawn uniformly from `--min-len`..`--max-len`. Both sides run
`training.sft.sft_loss` (padded: pack_tokens 0; packed: rows of `--pack-tokens`, default the longest conversation)
-> backward, alternately, `--repeats` times. Prints each side's median, the token counts each forward runs and the
ratio padded / packed, and checks that both give the same loss.

    python benchmarks/packing.py                       # qwen2-5m, 32 conversations of 16..512 tokens
    python benchmarks/packing.py --preset qwen2-20m --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from thermik.models.presets import PRESETS, init_model
from thermik.training.packing import pack
from thermik.training.sft import sft_loss


def mixed_batch(n: int, low: int, high: int, vocab: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """n conversations of uniform random length in [low, high], loss on the second half of each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length in torch.randint(low, high + 1, (n,), generator=g).tolist():
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append((ids, [0] * (length // 2) + [1] * (length - length // 2)))
    return out


def train_pass(model: torch.nn.Module, batch: list, pack_tokens: int) -> tuple[float, float]:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss = sft_loss(model, batch, 0, pack_tokens=pack_tokens)
    loss.backward()
    return time.perf_counter() - t0, float(loss.detach())


def run(model: torch.nn.Module, batch: list, pack_tokens: int, repeats: int) -> dict[str, float]:
    """Medians of both sides (alternating) and their ratio; raises if the two losses differ beyond rounding."""
    times: dict[int, list[float]] = {0: [], pack_tokens: []}
    losses: dict[int, float] = {}
    for _ in range(repeats):
        for side in (0, pack_tokens):
            seconds, losses[side] = train_pass(model, batch, side)
            times[side].append(seconds)
    if abs(losses[0] - losses[pack_tokens]) > 1e-4 * max(1.0, abs(losses[0])):
        raise AssertionError(f"packed loss {losses[pack_tokens]} differs from padded {losses[0]}")
    padded, packed = statistics.median(times[0]), statistics.median(times[pack_tokens])
    return {"padded_s": padded, "packed_s": packed, "ratio": padded / packed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local HF model directory (default: a fresh --preset)")
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--pack-tokens", type=int, default=0, help="tokens per packed row (0: the longest)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 2 <= args.min_len <= args.max_len:
        parser.error("need 2 <= --min-len <= --max-len")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).train()
    batch = mixed_batch(args.batch, args.min_len, args.max_len, model.config.vocab_size, args.seed)
    pack_tokens = args.pack_tokens or max(len(ids) for ids, _ in batch)
    packed = pack([ids for ids, _ in batch], pack_tokens, 0)
    real = sum(len(ids) for ids, _ in batch)
    print(
        f"{args.model or args.preset}, float32, {torch.get_num_threads()} threads: {len(batch)} conversations, "
        f"{real} tokens; padded {len(batch)} x {max(len(i) for i, _ in batch)}, packed {packed.rows} x "
        f"{packed.input_ids.shape[1]}"
    )
    result = run(model, batch, pack_tokens, args.repeats)
    print(f"padded {result['padded_s']:.3f} s, packed {result['packed_s']:.3f} s: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()

"""SFT forward+backward on a batch of mixed lengths: packed sequences (training/packing.py) against the padded batch.

One process, one model (a local HF checkpoint with --model, else a freshly initialised preset) on `--device`, one
batch of `--batch` conversations whose lengths are drawn uniformly from `--min-len`..`--max-len`. Three sides run
`training.sft.sft_loss` -> backward, in turn, `--repeats` times: padded (pack_tokens 0); packed varlen (one row,
per-sequence attention: flash varlen with a flash-attention model, else per-sequence SDPA); packed masked (rows of
`--pack-tokens`, default the longest conversation, with the block-diagonal mask). Prints each side's median and
the ratios, and checks that all give the same loss.

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
from thermik.training import packing
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


SIDES = ("padded", "varlen", "masked")


def run(model: torch.nn.Module, batch: list, pack_tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds of each side (in turn); raises if the losses differ beyond rounding."""
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    losses: dict[str, float] = {}
    default = packing.SEGMENTS_ON_CPU
    for _ in range(repeats):
        for side in SIDES:
            packing.SEGMENTS_ON_CPU = side == "varlen"  # off the CPU, varlen is the default for SDPA/eager
            segments = packing.VARLEN_SEGMENTS
            if side == "masked":
                packing.VARLEN_SEGMENTS = ()
            try:
                seconds, losses[side] = train_pass(model, batch, 0 if side == "padded" else pack_tokens)
            finally:
                packing.SEGMENTS_ON_CPU, packing.VARLEN_SEGMENTS = default, segments
            times[side].append(seconds)
    for side in SIDES[1:]:
        if abs(losses["padded"] - losses[side]) > 1e-4 * max(1.0, abs(losses["padded"])):
            raise AssertionError(f"{side} loss {losses[side]} differs from padded {losses['padded']}")
    return {side: statistics.median(times[side]) for side in SIDES}


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
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not 2 <= args.min_len <= args.max_len:
        parser.error("need 2 <= --min-len <= --max-len")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    model = model.to(args.device).train()
    batch = mixed_batch(args.batch, args.min_len, args.max_len, model.config.vocab_size, args.seed)
    pack_tokens = args.pack_tokens or max(len(ids) for ids, _ in batch)
    packed = pack([ids for ids, _ in batch], pack_tokens, 0)
    real = sum(len(ids) for ids, _ in batch)
    print(
        f"{args.model or args.preset}, float32, {args.device}, {torch.get_num_threads()} threads, attention "
        f"{model.config._attn_implementation}: {len(batch)} conversations, {real} tokens; padded {len(batch)} x "
        f"{max(len(i) for i, _ in batch)}, varlen 1 x {real}, masked {packed.rows} x {packed.input_ids.shape[1]}"
    )
    t = run(model, batch, pack_tokens, args.repeats)
    print(
        f"padded {t['padded']:.3f} s, varlen {t['varlen']:.3f} s, masked {t['masked']:.3f} s: padded/varlen "
        f"{t['padded'] / t['varlen']:.2f}x, padded/masked {t['padded'] / t['masked']:.2f}x"
    )


if __name__ == "__main__":
    main()

"""A bfloat16 prefill through the decode kernels (real tokens flattened) against the padded PyTorch forward.

One process, one bfloat16 model (a local HF checkpoint with --model, else a freshly initialised preset), one slot KV
cache. Each shape is `rows x width` new tokens after `start` cached positions (the cached prefix is prefilled first,
as in the engine); rows other than the first are ragged, their lengths drawn between width/2 and width. Both sides
call `NativeCausalLM.forward` on the same tokens, alternately, `--repeats` times: the baseline with the kernels
turned off (the padded forward: PyTorch norms and RoPE, SDPA under a mask, every padded position computed), ours
with them. Prints each shape's medians, the ratio, and how far the two sides' next-token distributions are apart
(they round differently: both are bfloat16 forwards).

    python benchmarks/prefill_paths.py --model /work/models/SmolLM2-135M-Instruct    # the example's prefill shapes
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from thermik.inference.native_model import NativeCausalLM
from thermik.models.presets import PRESETS, init_model

# (rows, width, cached positions): the SmolLM2 example's prefills, from a step's first prompts to its tool results.
SHAPES = ((1, 14, 240), (7, 18, 245), (6, 29, 250), (8, 44, 169), (1, 169, 0), (8, 212, 0))


def timed(native: NativeCausalLM, kernels: object, args: tuple) -> tuple[float, torch.Tensor]:
    native.kernels = kernels
    t0 = time.perf_counter()
    logits = native.forward(*args)
    return time.perf_counter() - t0, logits


def shape_row(native: NativeCausalLM, shape: tuple[int, int, int], repeats: int, seed: int) -> None:
    rows, width, start = shape
    gen = torch.Generator().manual_seed(seed)
    vocab, kernels = native.embed.weight.shape[0], native.kernels
    slots = torch.arange(rows) * 2
    last = torch.randint(width // 2, width, (rows,), generator=gen)
    last[0] = width - 1
    cache = native.new_cache(2 * rows, start + width + 1)
    if start:
        prefix = torch.randint(2, vocab, (rows, start), generator=gen)
        native.forward(prefix, slots, torch.zeros(rows, dtype=torch.long), torch.full((rows,), start - 1), cache)
    args = (torch.randint(2, vocab, (rows, width), generator=gen), slots, torch.full((rows,), start), last, cache)
    times: dict[str, list[float]] = {"padded": [], "kernels": []}
    logits = {}
    for _ in range(repeats + 1):  # the first round warms up
        for name, fused in (("padded", None), ("kernels", kernels)):
            seconds, logits[name] = timed(native, fused, args)
            times[name].append(seconds)
    native.kernels = kernels
    base, ours = (statistics.median(times[name][1:]) * 1e3 for name in times)
    p, q = (logits[name].log_softmax(-1) for name in times)
    kl = float((p.exp() * (p - q)).sum(-1).max())
    real = int((last + 1).sum())
    head = f"  {rows} x {width:<4} after {start:<4} ({real:>5} real tokens)"
    print(f"{head}  padded {base:8.1f} ms  kernels {ours:8.1f} ms  ratio {base / ours:5.2f}x   max KL {kl:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local HF model directory (default: a fresh --preset)")
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.bfloat16).eval()
    native = NativeCausalLM(model)
    if native.kernels is None:
        raise SystemExit("no CPU kernels here (no C compiler, or not a CPU model): there is nothing to compare")
    name = Path(args.model).name if args.model else args.preset
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads, {name} in bfloat16, median of {args.repeats}:")
    for shape in SHAPES:
        shape_row(native, shape, args.repeats, args.seed)


if __name__ == "__main__":
    main()

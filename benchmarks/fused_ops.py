"""The shared-prompt training forward+backward with its fused norms, RoPE and SwiGLU gate against the PyTorch ops.

One process, one model (a local HF checkpoint with --model, else a freshly initialised preset), one micro-batch
shaped like the SmolLM2 example's (`--prompts` groups of `--group` samples, each its group's `--prompt-tokens`-token
prompt and a response of `--min-response`..`--max-response` tokens). Both sides run `training.update.batch_logprobs`
(the shared-prompt forward, the fused lm head) -> a token-mean loss -> backward, alternately, `--repeats` times; the
baseline turns off `training/fused_ops.py`'s kernels only (its PyTorch ops run). Prints each side's median and
the ratio baseline / fused.

    python benchmarks/fused_ops.py --model /work/models/SmolLM2-135M-Instruct      # bf16-mixed, the example's shape
    python benchmarks/fused_ops.py --preset qwen2-5m --precision float32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from shared_prefix_vs_plain import add_batch_arguments, check_batch_arguments, grouped_batch
from transformers import AutoModelForCausalLM

from thermik.models.presets import PRESETS, init_model
from thermik.training import fused_ops
from thermik.training.batch import TokenBatch
from thermik.training.update import batch_logprobs

KERNELS = fused_ops._kernels


def train_pass(model: torch.nn.Module, batch: TokenBatch, autocast: torch.dtype | None, fused: bool) -> float:
    fused_ops._kernels = KERNELS if fused else lambda *tensors: None
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp, _ = batch_logprobs(model, batch, 1.0, True, autocast, entropy_grad=False)
    (-(logp * batch.mask).sum() / batch.num_tokens).backward()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local HF model directory (default: a fresh --preset)")
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--precision", default="bf16-mixed", choices=("bf16-mixed", "float32"))
    add_batch_arguments(parser, prompts=2, prompt_tokens=206, responses=(40, 150), repeats=5)
    args = parser.parse_args()
    check_batch_arguments(parser, args)
    if args.model is not None and not Path(args.model, "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (give a local HF model directory)")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).train()
    autocast = torch.bfloat16 if args.precision == "bf16-mixed" else None
    batch = grouped_batch(args, model.config.vocab_size)
    print(f"{args.model or args.preset}, {args.precision}, {len(batch)} rows, {int(batch.num_tokens)} trained tokens")
    times: dict[bool, list[float]] = {False: [], True: []}
    for fused in (False, True):
        train_pass(model, batch, autocast, fused)  # warm-up
    for i in range(args.repeats):
        for fused in (False, True) if i % 2 == 0 else (True, False):
            times[fused].append(train_pass(model, batch, autocast, fused))
    fused_ops._kernels = KERNELS
    base, ours = statistics.median(times[False]), statistics.median(times[True])
    print(f"PyTorch ops: {base:.3f} s  fused: {ours:.3f} s  (median forward+backward of {args.repeats})")
    print(f"ratio PyTorch / fused: {base / ours:.2f}x")


if __name__ == "__main__":
    main()

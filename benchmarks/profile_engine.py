"""Where a decode step and a prefill of the embedded engine's native forward spend their time (torch profiler).

Loads a local HF model (`--model DIR`) or a fresh preset, casts it to each `--dtypes`, and for each batch size
times `--steps` decode steps (one token per row, over a `--context`-token cache) and one prefill of
`--prompt-tokens` tokens per row. The profiler's self CPU time per op is grouped into matmul (the projections and
the lm head), attention, norms/RoPE/elementwise, sampling-side ops and the rest (Python, the fused C kernels,
which the profiler does not see). One table per (dtype, batch, phase).

    python benchmarks/profile_engine.py --model /work/models/SmolLM2-135M-Instruct --batches 1 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, PreTrainedModel

from thermik.inference.native_model import NativeCausalLM
from thermik.models.presets import PRESETS, init_model

GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "mkldnn::"),
    "attention": ("aten::bmm", "aten::baddbmm", "softmax", "scaled_dot_product", "flash_attention"),
    "norm/rope/elementwise": ("rms_norm", "aten::mul", "aten::add", "aten::cat", "aten::silu", "aten::neg", "pow"),
    "copies/indexing": ("aten::copy_", "aten::index", "aten::to", "aten::_to_copy", "aten::embedding", "clone"),
}


def group_of(name: str) -> str:
    for group, keys in GROUPS.items():
        if any(k in name for k in keys):
            return group
    return "other aten ops"


def load(args: argparse.Namespace, tmp: str) -> PreTrainedModel:
    path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=0)
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()


def run_phase(native: NativeCausalLM, batch: int, phase: str, args: argparse.Namespace) -> tuple[float, dict]:
    """Wall ms per call of one phase, and the profiler's self CPU ms per group (per call)."""
    vocab = native.embed.weight.shape[0]
    cache = native.new_cache(batch, args.context + args.prompt_tokens + args.steps + 2)
    slots = slice(0, batch)
    if phase == "prefill":
        tokens = torch.randint(1, vocab, (batch, args.prompt_tokens))
        starts, last, calls = torch.zeros(batch, dtype=torch.long), torch.full((batch,), args.prompt_tokens - 1), 1
    else:
        native.forward(torch.randint(1, vocab, (batch, args.context)), slots, torch.zeros(batch, dtype=torch.long),
                       torch.zeros(batch, dtype=torch.long), cache)  # fmt: skip
        tokens, calls = torch.randint(1, vocab, (batch, 1)), args.steps
        starts, last = torch.full((batch,), args.context), torch.zeros(batch, dtype=torch.long)

    def step() -> None:
        for _ in range(calls):
            native.forward(tokens, slots, starts, last, cache)

    step()  # warm-up (oneDNN primitive creation, kernel build)
    t0 = time.perf_counter()
    step()
    wall = (time.perf_counter() - t0) / calls * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        step()
        profiled = (time.perf_counter() - t0) / calls * 1e3
    groups: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():  # self time of the ops on this thread, as a share of the profiled call
        groups[group_of(evt.key)] += evt.self_cpu_time_total / 1e3 / calls / profiled * wall
    return wall, dict(groups)


def report(dtype: str, batch: int, phase: str, wall: float, groups: dict[str, float], tokens: int) -> None:
    seen = sum(groups.values())
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    print(f"\n{dtype} batch {batch} {phase}: {wall:.2f} ms per call, {tokens / wall * 1e3:.0f} tok/s")
    for name, ms in rows:
        print(f"  {name:24s} {ms:8.2f} ms  {ms / wall:5.1%}")
    print(f"  {'python + C kernels':24s} {max(wall - seen, 0):8.2f} ms  {max(wall - seen, 0) / wall:5.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="local HF model directory (default: a fresh --preset)")
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--context", type=int, default=128, help="cached tokens per row before the decode steps")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="decode steps profiled")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        base = load(args, tmp)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {args.model or args.preset}")
    for dtype in args.dtypes:
        native = NativeCausalLM(base.to(getattr(torch, dtype)))
        for batch in args.batches:
            for phase, tokens in (("decode", batch), ("prefill", batch * args.prompt_tokens)):
                wall, groups = run_phase(native, batch, phase, args)
                report(dtype, batch, phase, wall, groups, tokens)


if __name__ == "__main__":
    main()

"""Where one decode step of the embedded engine's own loop goes: each section timed by wrapping the engine's methods.

Unlike `profile_engine.py` (the native forward under the torch profiler), this runs `EmbeddedEngine.generate_batch`
as a rollout does, scheduler thread included, and reports milliseconds per decode step for the whole step, the
forward, the C decode attention, RoPE + KV store and RMSNorm kernels, the projections and the lm head (on the
weights `--precision` chooses: e.g. `int8`'s packed ones, cpu/gemm.py) and the sampling side
(`fused_sample`, the C sampler of the plain setting, or else `process_logits`, `sample`, `token_logprobs`). A
profiling tool, not a comparison: run it before and after a change. On a shared machine, `--threads 1 --clock cpu`
(process CPU seconds, as in engine_vs_hf.py) leaves other processes' load out.

    python benchmarks/engine_step_sections.py --model /work/models/SmolLM2-135M-Instruct --batch 64 --tokens 128
    THERMIK_CPU_ISA=avx2 python benchmarks/engine_step_sections.py --model /work/models/SmolLM2-135M-Instruct \
        --precision int8 --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import collections
import random
from collections.abc import Callable

import torch
from cpu_peak import add_clock_argument, now, set_clock
from transformers import AutoModelForCausalLM

import thermik.inference.embedded.records as records_module
from thermik.cpu.engine_precision import PRECISIONS
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import embedded_engine

SECTIONS = ("decode step", "forward", "attention", "rope+store", "rms norm", "projections", "lm head",
            "sample+record", "fused_sample", "process_logits", "sample", "token_logprobs")  # fmt: skip


def wrap(owner: object, name: str, key: str, totals: dict[str, float], calls: collections.Counter) -> None:
    """Replace owner.name with a version that adds its time (cpu_peak's clock) to totals[key] and counts its calls."""
    inner: Callable = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = now()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += now() - t0
            calls[key] += 1

    setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local HF model directory")
    parser.add_argument("--precision", default="bfloat16", choices=PRECISIONS, help="inference.precision")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128, help="sampled tokens per request")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    add_clock_argument(parser)
    args = parser.parse_args(argv)
    set_clock(args.clock)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)
    engine = embedded_engine(
        model, precision=args.precision, eos_token_ids=[], pad_token_id=0, max_batch_size=args.batch
    )
    totals: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    wrap(engine.decoder, "step", "decode step", totals, calls)
    wrap(engine.native, "forward", "forward", totals, calls)
    wrap(engine.records, "record", "sample+record", totals, calls)
    for layer in engine.native.layers:
        for projection in layer.projections():
            wrap(projection, "fused", "projections", totals, calls)
    wrap(engine.native.lm_head, "fused", "lm head", totals, calls)
    for name in ("fused_sample", "process_logits", "sample", "token_logprobs"):
        wrap(records_module, name, name, totals, calls)
    if engine.native.kernels is not None:
        for name, key in (("decode_attention", "attention"), ("rope_store", "rope+store"), ("rms_norm", "rms norm")):
            wrap(engine.native.kernels, name, key, totals, calls)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)] for _ in range(args.batch)]
    params = [SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i) for i in range(args.batch)]
    engine.generate_batch(prompts, params)  # warm-up: oneDNN primitives, cache buffers
    totals.clear()
    calls.clear()
    t0 = now()
    engine.generate_batch(prompts, params)
    wall = now() - t0
    with engine._model_lock:  # the last results arrive inside the last timed step: let it finish counting
        steps = calls["decode step"]  # the forward's total also holds the prefill
    rate = args.batch * args.tokens / wall
    print(f"{args.model}, {args.precision}, batch {args.batch} x {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads, {args.clock} clock: {rate:.0f} tok/s, {steps} decode steps")  # fmt: skip
    per_step = {key: 1e3 * totals[key] / max(steps, 1) for key in SECTIONS}
    for key in SECTIONS:
        print(f"  {key:<15} {per_step[key]:7.2f} ms/step")
    return per_step


if __name__ == "__main__":
    main()

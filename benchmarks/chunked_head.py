"""Peak memory and time of the lm head + token logprobs + entropy, forward and backward: the full logits
(`hidden @ W.T` then `vocab_logprobs`) against `training/chunked_head.ChunkedHeadLogprobs` (chunks of --chunk tokens,
recomputed in backward).

Each side runs in a fresh child process. Peak memory: on CUDA `torch.cuda.max_memory_allocated` above what the
inputs take; on the CPU the child's peak resident set (`ru_maxrss`) above its resident set after the inputs are made.
Also checks that both sides give the same values and gradients.

    python benchmarks/chunked_head.py                                   # SmolLM2's head: 4096 tokens x 49152 x 576
    python benchmarks/chunked_head.py --vocab 151936 --hidden 896 --tokens 8192 --device cuda   # Qwen2.5-0.5B's
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time

import torch

from thermik.training.chunked_head import ChunkedHeadLogprobs
from thermik.training.vocab_logprobs import vocab_logprobs


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def _side(args: argparse.Namespace, chunked: bool, out: str) -> None:
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, requires_grad=True)
    weight = (torch.randn(args.vocab, args.hidden, device=device, dtype=dtype) * 0.05).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _rss_kb() * 1024
    t0 = time.perf_counter()
    if chunked:
        logp, ent = ChunkedHeadLogprobs.apply(hidden, weight, targets, 1.0, dtype, args.chunk)
    else:
        logp, ent = (x[0] for x in vocab_logprobs((hidden @ weight.T)[None], targets[None]))
    (logp.sum() + 0.01 * ent.sum()).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seconds = time.perf_counter() - t0
    torch.save((peak, seconds, logp.detach().float().cpu(), hidden.grad.float().cpu(), weight.grad.float().cpu()), out)


def measure(args: argparse.Namespace, chunked: bool) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/side.pt"
        proc = mp.get_context("spawn").Process(target=_side, args=(args, chunked, path))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"the {'chunked' if chunked else 'full'} side failed (exit {proc.exitcode})")
        return torch.load(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    full, chunked = measure(args, False), measure(args, True)
    for a, b in zip(full[2:], chunked[2:], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)
    mb = 2**20
    print(
        f"head [{args.tokens} x {args.hidden}] @ [{args.vocab} x {args.hidden}]^T, {args.dtype}, {args.device}, "
        f"{torch.get_num_threads()} threads; full logits {args.tokens * args.vocab * 4 / mb:.0f} MiB in float32"
    )
    print(f"full:    peak +{full[0] / mb:.0f} MiB, {full[1]:.2f} s")
    print(f"chunked: peak +{chunked[0] / mb:.0f} MiB, {chunked[1]:.2f} s (chunks of {args.chunk} tokens)")
    print(f"peak ratio full / chunked: {full[0] / max(chunked[0], 1):.1f}x")


if __name__ == "__main__":
    main()

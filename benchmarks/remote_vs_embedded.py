"""Generation throughput through `thermik inference` (RemoteEngine over HTTP) against the embedded engine.

python benchmarks/remote_vs_embedded.py --preset qwen2-5m --batch 64 --max-tokens 64 --rounds 3

One process builds a preset model in a temp dir, starts `thermik inference` on it as a subprocess (a free
loopback port) and holds an EmbeddedEngine over the same weights. Each round runs the same batch of seeded
requests through both, alternating, so background load hits both alike; it prints sampled tokens/s per side,
the ratio remote/embedded, and whether both sampled the same token ids (they should: per-request seeds).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from thermik.inference.base import Generation, InferenceEngine, SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.remote import RemoteEngine
from thermik.models.loading import load_model, load_tokenizer
from thermik.models.presets import PRESETS, init_model


def start_server(model_dir: Path, log: Path, max_batch_size: int) -> tuple[subprocess.Popen[bytes], str]:
    args = [sys.executable, "-m", "thermik.cli", "inference", "--model.path", str(model_dir), "--server.port", "0",
            "--inference.max_batch_size", str(max_batch_size)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        match = re.search(r"Uvicorn running on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"thermik inference did not start:\n{log.read_text(errors='replace')}")


async def timed_batch(
    engine: InferenceEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[float, list[Generation]]:
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    return time.perf_counter() - t0, list(gens)


async def run(args: argparse.Namespace, model_dir: Path, url: str) -> None:
    tokenizer = load_tokenizer(model_dir)
    stop_ids = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id} - {None})
    embedded = EmbeddedEngine(load_model(model_dir).requires_grad_(False), eos_token_ids=stop_ids,
                              pad_token_id=tokenizer.pad_token_id, max_batch_size=args.batch)  # fmt: skip
    remote = RemoteEngine(url, stop_token_ids=stop_ids)
    prompts = [
        tokenizer.encode(f"Reverse the text: sample {i} abcdef", add_special_tokens=False) for i in range(args.batch)
    ]
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i) for i in range(args.batch)]
    await timed_batch(embedded, prompts, params)  # warm-up both sides
    await timed_batch(remote, prompts, params)
    times: dict[str, list[float]] = {"embedded": [], "remote": []}
    tokens: dict[str, int] = {}
    same = True
    for _ in range(args.rounds):
        t_e, g_e = await timed_batch(embedded, prompts, params)
        t_r, g_r = await timed_batch(remote, prompts, params)
        times["embedded"].append(t_e)
        times["remote"].append(t_r)
        tokens = {"embedded": sum(len(g.token_ids) for g in g_e), "remote": sum(len(g.token_ids) for g in g_r)}
        same &= [g.token_ids for g in g_e] == [g.token_ids for g in g_r]
    rate = {k: tokens[k] * len(v) / sum(v) for k, v in times.items()}
    print(f"preset {args.preset}, batch {args.batch}, {args.max_tokens} tokens, {args.rounds} rounds (interleaved)")
    for k in ("embedded", "remote"):
        print(f"  {k:9s} {rate[k]:8.0f} tokens/s  (s/batch: {', '.join(f'{t:.2f}' for t in times[k])})")
    print(f"ratio remote/embedded tokens/s: {rate['remote'] / rate['embedded']:.2f}x; same token ids: {same}")
    await embedded.close()
    await remote.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(args.preset, Path(tmp) / args.preset, seed=0)
        proc, url = start_server(model_dir, Path(tmp) / "server.log", args.batch)
        try:
            asyncio.run(run(args, model_dir, url))
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()

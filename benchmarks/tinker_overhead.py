"""What the Tinker API costs: a `forward_backward` + `optim_step` round trip through the tinker SDK against
`thermik tinker` on loopback, against the same two calls on the service's `Trainer` in this process.

Both sides train a fresh rank-8 LoRA adapter of the same local model on the same fixed batch (cross_entropy).
Rounds alternate SDK / in-process so machine noise hits both alike; each side reports the median over rounds of the
mean seconds per step. The SDK side includes protobuf + zstd encoding, HTTP, the server's queue and the long-polled
futures. The server runs as a subprocess, as a user starts it.

Run: `python benchmarks/tinker_overhead.py [--model DIR | --preset qwen2-1m] [--steps 10] [--rounds 3] [--batch 8]
[--threads 1]`.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

API_KEY = "tml-thermik-bench"


@dataclass(frozen=True)
class OverheadResult:
    sdk_s: float
    local_s: float
    steps: int
    batch: int
    tokens: int


def batch_tokens(model_dir: Path, batch: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir).encode("the quick brown fox jumps over the lazy dog " * 40)
    return [ids[i : i + length + 1] for i in range(batch)]


def local_steps(model_dir: Path, rows: list[list[int]], steps: int) -> float:
    """Mean seconds per forward_backward + optim_step on the Trainer, in this process."""
    from thermik.tinker.trainer import FwdBwdPart, Trainer
    from thermik.tinker.wire import Datum

    trainer = Trainer(model_dir)
    trainer.create("bench", {"rank": 8, "seed": 0})
    data = [Datum(np.array(r[:-1]), {"target_tokens": np.array(r[1:]), "weights": np.ones(len(r) - 1)}) for r in rows]
    adam = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.forward_backward("bench", "cross_entropy", {}, [FwdBwdPart(data)], forward_only=False)
        trainer.optim_step("bench", adam)
    return (time.perf_counter() - t0) / steps


def sdk_steps(url: str, model_dir: Path, rows: list[list[int]], steps: int) -> float:
    """Mean seconds per forward_backward + optim_step through the tinker SDK (both awaited each step)."""
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    client = service.create_lora_training_client(base_model=str(model_dir), rank=8, seed=0).result()
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1]),
            loss_fn_inputs={"target_tokens": np.array(r[1:]), "weights": np.ones(len(r) - 1, np.float32)},
        )
        for r in rows
    ]
    t0 = time.perf_counter()
    for _ in range(steps):
        fwdbwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=1e-3))
        fwdbwd.result()
        optim.result()
    return (time.perf_counter() - t0) / steps


def start_server(model_dir: Path, state: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--model.path", str(model_dir), "--server.port", str(port), "--service.state_dir", str(state)]
    args += ["--service.num_threads", str(threads)]
    log = (state.parent / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "thermik.cli", "tinker", *args], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"thermik tinker did not start; see {state.parent / 'server.log'}")


def measure(args: argparse.Namespace, model_dir: Path, work: Path) -> OverheadResult:
    import torch

    torch.set_num_threads(args.threads)  # the server's training thread gets the same count
    steps, rounds, batch, length = args.steps, args.rounds, args.batch, args.length
    rows = batch_tokens(model_dir, batch, length)
    proc, url = start_server(model_dir, work / "state", args.threads)
    try:
        sdk, local = [], []
        for _ in range(rounds):
            sdk.append(sdk_steps(url, model_dir, rows, steps))
            local.append(local_steps(model_dir, rows, steps))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return OverheadResult(statistics.median(sdk), statistics.median(local), steps, batch, batch * length)


def format_result(r: OverheadResult) -> str:
    return "\n".join([
        f"forward_backward + optim_step, batch {r.batch} x {r.tokens // r.batch} tokens, {r.steps} steps per round",
        f"  in-process Trainer:        {r.local_s * 1000:8.1f} ms/step",
        f"  tinker SDK over loopback:  {r.sdk_s * 1000:8.1f} ms/step",
        f"  ratio SDK/in-process: {r.sdk_s / r.local_s:.2f}x (overhead {1000 * (r.sdk_s - r.local_s):.1f} ms/step)",
    ])  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="Local HF model dir (default: build --preset).")
    p.add_argument("--preset", default="qwen2-1m", help="Preset built when --model is not given.")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=64, help="Tokens per datum.")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides' training.")
    args = p.parse_args(argv)
    if min(args.steps, args.rounds, args.batch, args.length, args.threads) < 1:
        p.error("--steps, --rounds, --batch, --length and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TINKER_API_KEY", API_KEY)
    with tempfile.TemporaryDirectory(prefix="tinker_overhead_") as tmp:
        work = Path(tmp)
        model_dir = args.model
        if model_dir is None:
            from thermik.models.presets import init_model

            model_dir = init_model(args.preset, work / args.preset)
        print(format_result(measure(args, model_dir.resolve(), work)))


if __name__ == "__main__":
    main()

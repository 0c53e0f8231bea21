"""Trainer throughput and MFU: float32 against bf16-mixed (`model.train_precision`), full fine-tune and LoRA.

One process, one model: a freshly initialised preset (thermik.models.presets.init_model), a random-init model of a
published shape (`--shape smollm2-135m|qwen2.5-0.5b`, thermik.models.presets.SHAPES) or any local HF directory
(`--model DIR`), on `--device` (cpu, cuda). Each variant (full / LoRA x float32 / bf16-mixed) holds its own float32
copy of the model and its own AdamW, and runs the product's RL update, `training.update.policy_update` (the function
`thermik rl` calls: the forward in `batch_logprobs`, the loss, backward, clip, optimizer step) on one fixed batch of
`--batch` rows of `--seq` tokens, every token trained (no shared prompts, so every row costs a full forward). The
variants alternate `--rounds` times after one warm-up step each (so background load hits all alike); the best step of
each is reported (on a GPU, timed to its last kernel).

Peak: the model's own projections (q, k, v, o, gate, up, down, lm head) timed alone as `x @ W^T` with M = batch * seq
rows, in bfloat16 and in float32, in the same run; the peak of a dtype is their total FLOPs over their total time.

`--peak-matmul N` also times one N x N x N bfloat16 product on the device (8192 on a GPU: its reachable bf16 rate)
and adds the MFU over it. On a CPU the float32 FMA peak (a 2048^3 matmul, benchmarks/cpu_peak.py) is measured in the
same run too, and each variant's share of it printed ("of FMA peak"), with a line saying whether the run simulates a
smaller instruction set (THERMIK_CPU_ISA, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA). `--precisions float32` skips
bf16-mixed (on a CPU without bfloat16 arithmetic it runs ~100x slower).

MFU = FLOPs per token * tokens/s / bf16 peak, with FLOPs per token = 6 N for a full fine-tune and 4 N for LoRA
(forward 2N + input gradients 2N; the frozen weights get no weight gradient; the adapters' FLOPs are ignored), N = the
parameters of the matrix products: every Linear of the decoder plus the lm head (embedding lookups are not
products). Attention's own score/value products (12 * layers * hidden * seq per token, PaLM's accounting, halved for
causal; forward + backward = 3x the forward either way, their inputs need gradients) are added to both.

`--speed compile checkpointing` adds the full fine-tune in bf16-mixed with `trainer.compile` (each decoder layer
through torch.compile; its warm-up step pays the compile) and with `trainer.activation_checkpointing`
(training/speed.py); the MFU counts the model's FLOPs only, so checkpointing's recomputed forward lowers it.

`--before` adds "full float32-before": the float32 full fine-tune as main ran it before the vocabulary kernels and
fused AdamW (training/vocab_logprobs.py, training/optim.py): a float32 log-softmax over the whole [B, T, V] logits,
gather, the entropy from it, and AdamW's per-tensor loop. It is the float32 step the bf16-mixed speed-up is
stated against; the plain "full float32" row runs the current code in float32.

    python benchmarks/trainer_mfu.py                                  # qwen2-5m preset
    python benchmarks/trainer_mfu.py --model /work/models/SmolLM2-135M-Instruct --batch 4 --seq 256 --rounds 2
    python benchmarks/trainer_mfu.py --device cuda --shape qwen2.5-0.5b --only full --batch 8 --seq 512 \
        --peak-matmul 8192
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from cpu_peak import add_clock_argument, fma_peak, isa_line, now, peak_line, set_clock
from transformers import AutoModelForCausalLM, PreTrainedModel

from thermik.config.schema import AlgorithmConfig, LoRAConfig, OptimizerConfig, TrainerConfig
from thermik.models.presets import PRESETS, SHAPES, init_model, shape_config
from thermik.training.batch import TokenBatch
from thermik.training.loss import LossSetup
from thermik.training.optim import build_optimizer
from thermik.training.speed import apply_train_speed
from thermik.training.update import policy_update

CPU = torch.device("cpu")
PRECISIONS: dict[str, torch.dtype | None] = {"float32": None, "bf16-mixed": torch.bfloat16, "float32-before": None}


@dataclass
class Variant:
    name: str
    lora: bool
    precision: str
    step: Callable[[], object]
    best_s: float = float("inf")


def fixed_batch(batch: int, seq: int, vocab: int, seed: int, device: torch.device = CPU) -> TokenBatch:
    """`batch` rows of `seq` random tokens, every next-token position trained, advantages of both signs."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq - 1)
    adv = torch.randn(batch, 1, generator=gen).expand(-1, seq - 1).clone()
    rollout_logp = torch.full((batch, seq - 1), -8.0)
    return TokenBatch(ids, torch.ones_like(ids), mask, rollout_logp, adv, group_ids=torch.arange(batch)).to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA call returns before its kernels end)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def logprobs_before(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0):
    """The trainer's logprobs before training/vocab_logprobs.py: a float32 log-softmax over all of [B, T, V]."""
    logp_all = torch.log_softmax(logits[:, : targets.shape[1]].float() / temperature, dim=-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), entropy


def make_variant(
    base: PreTrainedModel, lora: bool, precision: str, batch: TokenBatch, args, speed: str = ""
) -> Variant:
    """A variant's own model copy and optimizer, and one update step on `batch` through `policy_update`. `speed`:
    "compile" or "checkpointing" (trainer.compile, trainer.activation_checkpointing: training/speed.py)."""
    model = copy.deepcopy(base).train()
    apply_train_speed(model, activation_checkpointing=speed == "checkpointing", compile=speed == "compile")
    if lora:
        from thermik.training.lora import apply_lora

        model = apply_lora(model, LoRAConfig(enabled=True, rank=args.lora_rank))
    before = precision == "float32-before"
    unfused = mock.patch("thermik.training.optim._fusable", lambda params: None)
    with unfused if before else contextlib.nullcontext():
        optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-5))
    trainer = TrainerConfig(micro_batch_size=args.micro or args.batch, shared_prefix=False)
    setup = LossSetup.from_config(AlgorithmConfig(), trainer, 1.0, autocast=PRECISIONS[precision])

    def step() -> object:
        if not before:
            return policy_update(model, None, batch, setup, optimizer, scheduler)
        with mock.patch("thermik.training.batch.vocab_logprobs", logprobs_before):
            return policy_update(model, None, batch, setup, optimizer, scheduler)

    return Variant(f"{'lora' if lora else 'full'} {precision}{' ' + speed if speed else ''}", lora, precision, step)


def matmul_shapes(model: PreTrainedModel) -> list[tuple[str, int, int, int]]:
    """(name, in, out, count) of the model's matrix products: every decoder Linear by name, plus the lm head."""
    shapes: dict[str, tuple[int, int, int]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            short = name.rsplit(".", 1)[-1]
            k, n, count = module.in_features, module.out_features, shapes.get(short, (0, 0, 0))[2]
            shapes[short] = (k, n, count + 1)
    return [(name, k, n, count) for name, (k, n, count) in shapes.items()]


def matmul_seconds(rows: int, k: int, n: int, dtype: torch.dtype, repeats: int, device: torch.device = CPU) -> float:
    """Best time of one `rows x k @ k x n` in `dtype` on `device` (one warm-up call)."""
    x, w = torch.randn(rows, k, dtype=dtype, device=device), torch.randn(n, k, dtype=dtype, device=device)
    x @ w.T
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = now()
        x @ w.T
        synchronize(device)
        best = min(best, now() - t0)
    return best


def square_peak(size: int, device: torch.device, repeats: int) -> float:
    """FLOP/s of one `size`^3 bfloat16 product (the best of `repeats`, at least 5): the device's reachable bf16 rate."""
    rate = 2.0 * size**3 / matmul_seconds(size, size, size, torch.bfloat16, max(repeats, 5), device)
    print(f"bf16 peak: {size} x {size} x {size} product {rate / 1e12:.1f} TFLOP/s")
    return rate


def peaks(model: PreTrainedModel, rows: int, repeats: int) -> dict[str, float]:
    """{dtype name: FLOP/s} over the model's projection shapes at `rows` rows on the model's device; prints each."""
    out = {}
    device = next(model.parameters()).device
    print(f"matmul peak at the model's projection shapes, M = {rows} rows (GFLOP/s):")
    totals = {"bfloat16": [0.0, 0.0], "float32": [0.0, 0.0]}
    for name, k, n, count in matmul_shapes(model):
        line = f"  {name:>10} {k:5d} x {n:6d} (x{count:3d})"
        for dtype_name, total in totals.items():
            seconds = matmul_seconds(rows, k, n, getattr(torch, dtype_name), repeats, device)
            flops = 2.0 * rows * k * n
            total[0] += flops * count
            total[1] += seconds * count
            line += f"  {dtype_name} {flops / seconds / 1e9:7.1f}"
        print(line)
    for dtype_name, (flops, seconds) in totals.items():
        out[dtype_name] = flops / seconds
    print(f"  peak: bfloat16 {out['bfloat16'] / 1e9:.1f}, float32 {out['float32'] / 1e9:.1f} GFLOP/s "
          f"(ratio {out['bfloat16'] / out['float32']:.2f}x)")  # fmt: skip
    return out


def flops_per_token(model: PreTrainedModel, seq: int, lora: bool) -> float:
    """6 N (full) or 4 N (LoRA) + causal attention products; N = the parameters of every Linear (lm head included)."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cfg = model.config
    attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq / 2
    return (4 if lora else 6) * n + attention


def run(variants: list[Variant], rounds: int, device: torch.device = CPU) -> None:
    for v in variants:
        v.step()  # warm-up: oneDNN primitives, optimizer state
    for _ in range(rounds):
        for v in variants:
            synchronize(device)
            t0 = now()
            v.step()
            synchronize(device)
            v.best_s = min(v.best_s, now() - t0)


def report(model: PreTrainedModel, variants: list[Variant], args, peak: dict[str, float]) -> None:
    tokens = args.batch * args.seq
    print(f"\ntrain step on {args.batch} x {args.seq} tokens (policy_update; best of {args.rounds}):")
    extra = {"fma": "of FMA peak", "square": f"MFU({args.peak_matmul}^3 bf16)"}  # the peaks this run measured
    extra = {key: title for key, title in extra.items() if key in peak}
    head = f"{'MFU(bf16 peak)':>15} {'of fp32 peak':>13}" + "".join(f" {title:>17}" for title in extra.values())
    print(f"  {'variant':<17} {'step s':>7} {'tok/s':>8} {'TFLOP/s':>8} {head}")
    rates = {}
    for v in variants:
        rate = tokens / v.best_s
        achieved = flops_per_token(model, args.seq, v.lora) * rate
        rates[v.name] = rate
        shares = "".join(f" {achieved / peak[key]:16.1%}" for key in extra)
        print(f"  {v.name:<17} {v.best_s:7.3f} {rate:8.0f} {achieved / 1e12:8.3f} "
              f"{achieved / peak['bfloat16']:14.1%} {achieved / peak['float32']:12.1%}{shares}")  # fmt: skip
    for kind in ("full", "lora"):
        for base in ("float32", "float32-before"):
            if f"{kind} {base}" in rates and f"{kind} bf16-mixed" in rates:
                ratio = rates[f"{kind} bf16-mixed"] / rates[f"{kind} {base}"]
                print(f"  {kind}: bf16-mixed / {base} tokens/s = {ratio:.2f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--model", default="", help="a local HF model directory instead of a fresh --preset")
    parser.add_argument("--shape", default="", choices=("", *SHAPES), help="a random-init published shape instead")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0")
    parser.add_argument("--peak-matmul", type=int, default=0, help="also time one N^3 bf16 product (0: skip)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro", type=int, default=0, help="rows per micro-batch (0: the whole batch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--only", choices=("full", "lora"), nargs="*", help="which fine-tunes (default: both)")
    parser.add_argument("--peak-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before", action="store_true", help="add the full float32 step as main ran it before")
    parser.add_argument(
        "--speed",
        nargs="*",
        choices=("compile", "checkpointing"),
        default=[],
        help="add full bf16-mixed variants with trainer.compile / trainer.activation_checkpointing",
    )
    parser.add_argument("--precisions", nargs="*", choices=("float32", "bf16-mixed"), default=["float32", "bf16-mixed"])
    add_clock_argument(parser)
    args = parser.parse_args(argv)
    set_clock(args.clock)
    if min(args.batch, args.rounds, args.peak_repeats) < 1 or args.seq < 2:
        parser.error("--batch, --rounds and --peak-repeats must be >= 1, --seq >= 2")
    return args


def load(args: argparse.Namespace) -> tuple[PreTrainedModel, str]:
    """(float32 model on args.device, its name): a --shape built with random weights, else --model or --preset."""
    if args.shape:
        with torch.device(args.device):
            return AutoModelForCausalLM.from_config(shape_config(args.shape)).float(), f"{args.shape} (random init)"
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model.to(args.device), Path(args.model).name if args.model else args.preset


def main(argv: list[str] | None = None) -> list[Variant]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, name = load(args)
    device = next(model.parameters()).device
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {name}, {device}{gpu}")
    peak = peaks(model, args.batch * args.seq, args.peak_repeats)
    if device.type == "cpu":
        print(isa_line())
        fma = fma_peak(args.peak_repeats)
        print(peak_line(fma))
        peak["fma"] = fma["peak"]
    if args.peak_matmul:
        peak["square"] = square_peak(args.peak_matmul, device, args.peak_repeats)
    batch = fixed_batch(args.batch, args.seq, model.config.vocab_size, args.seed, device)
    kinds = args.only or ["full", "lora"]
    precisions = [p for p in PRECISIONS if p in args.precisions]
    variants = [make_variant(model, kind == "lora", p, batch, args) for kind in kinds for p in precisions]
    if args.before and "full" in kinds:
        variants.append(make_variant(model, False, "float32-before", batch, args))
    for speed in args.speed:  # the full fine-tune in bf16-mixed with trainer.compile / activation_checkpointing
        variants.append(make_variant(model, False, "bf16-mixed", batch, args, speed))
    run(variants, args.rounds, device)
    report(model, variants, args, peak)
    return variants


if __name__ == "__main__":
    main()

"""The embedded engine against transformers `generate`, session reuse against re-prefilling, weight-update cost.

One process, one model: a freshly initialised preset (thermik.models.presets.init_model), a random-init model of a
published shape (`--shape smollm2-135m|qwen2.5-0.5b`) or any local HF directory (`--model DIR`), in `--dtype` (float32
or bfloat16) on `--device` (cpu, cuda), three measurements:

1. Throughput: `--batch` prompts, exactly `--max-tokens` sampled tokens each (no eos stop on either side),
   temperature 1, no top-k/top-p. transformers: `model.generate(do_sample=True, min_new_tokens=max_new_tokens)`
   on the left-padded batch (its own copy of the weights). thermik: `EmbeddedEngine.generate_batch`. Tokens/s =
   batch * max_tokens / wall time. `--single-stream` adds the same at batch 1 (and llama.cpp on `--gguf`, when
   llama-cpp-python is installed). Then the roofline: each of the model's projections (q/k/v, o, gate/up, down,
   lm head) timed alone as a matmul at the batch's shape in the model's dtype (the faster of `x @ W^T` and
   oneDNN's prepacked linear); the roofline tok/s is batch / (the time of one decode step's matmuls), and thermik's
   fraction of it is printed.
2. Multi-turn: `--batch` concurrent 3-turn episodes (a `--context`-token prompt, `--turn-tokens` sampled
   tokens per turn, then a `--obs-tokens`-token observation), on the same engine with prefix/session reuse
   and with `reuse_prefixes=False` (every turn prefills the whole history).
3. Parity (`--only parity`): on the throughput prompts, greedy (temperature 0), `--max-tokens` each: the engine as
   built by default (on a GPU its decode step replayed as CUDA graphs, inference/decode_graphs.py) against the same
   fixed-shape step run eagerly (`decode_graphs="eager"`) and the native forward (`"off"`), with each one's wall time:
   how many rows' tokens are identical, and each side's per-token logprobs against transformers' (its own copy of the
   model, teacher-forced on the same tokens): the largest and the mean absolute difference.
4. Weight update: `engine.update_weights_sync(state_dict)` (checks names and shapes, copies in place, bumps the
   version) against a plain loop of `param.copy_(tensor)` over the same state dict.

Each measurement alternates the two sides `--repeats` times (so background load hits both alike) and reports
the best run of each; the ratio is ours over the baseline's speed.

Precision: `--precision` builds the engine as `thermik rl` does for `inference.precision` (cpu/engine_precision.py: e.g.
`auto`, which on a CPU without bfloat16 arithmetic times BLAS against thermik's packed float32 and bfloat16-stored
weights; `int8`); without it the engine runs the model in `--dtype` on PyTorch's products. `--compare PRECISION`
adds a second thermik engine to the throughput rows, in the same alternation, with its speed ratio to the first and
the mean per-token KL(first || second) over the first engine's sampled tokens (teacher-forced through both).
The throughput rows also print the CPU's float32 FMA peak (a 2048^3 matmul, benchmarks/cpu_peak.py) measured in the
same run and thermik's fraction of the roofline it allows (peak / FLOPs per token), and whether the run simulates a
smaller instruction set (THERMIK_CPU_ISA, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA).

    python benchmarks/engine_vs_hf.py --preset qwen2-5m --batch 64 --max-tokens 64
    python benchmarks/engine_vs_hf.py --model /work/models/SmolLM2-135M-Instruct --dtype bfloat16 \
        --max-tokens 128 --single-stream --only throughput
    THERMIK_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/engine_vs_hf.py \
        --model /work/models/SmolLM2-135M-Instruct --precision auto --compare int8 --batch 64 --max-tokens 128 \
        --single-stream --gguf /work/models/SmolLM2-135M-Instruct.Q8_0.gguf --only throughput
    python benchmarks/engine_vs_hf.py --device cuda --shape qwen2.5-0.5b --dtype bfloat16 --batch 64 \
        --max-tokens 128 --only throughput --no-roofline

On a GPU the CPU peak lines are skipped and every timing ends with the GPU's last kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from cpu_peak import add_clock_argument, fma_peak, isa_line, now, peak_line, set_clock
from transformers import AutoModelForCausalLM, PreTrainedModel

from thermik.cpu import gemm
from thermik.cpu.engine_precision import PRECISIONS, apply_precision, projection_formats
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.native_model import NativeCausalLM, can_prepack
from thermik.models.presets import PRESETS, SHAPES, init_model, shape_config

PAD = 0
WEIGHT_BYTES = 96 * 2**20  # weight copies cycled by the matmul microbenchmark: more than this CPU's 32 MiB L3


def synchronize() -> None:
    """Wait for queued GPU work (a CUDA call returns before its kernels end); nothing where CUDA is unused."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def best_of(repeats: int, sides: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Run the sides alternately `repeats` times; best wall time of each (after one warm-up call each)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            synchronize()
            t0 = now()
            fn()
            synchronize()
            times[name].append(now() - t0)
    return {name: min(ts) for name, ts in times.items()}


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (length - (i % 7),), generator=gen).tolist() for i in range(batch)]


def hf_generate(model: PreTrainedModel, batch: list[list[int]], max_tokens: int) -> None:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), PAD)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=PAD,
        )
    assert out.shape[1] == width + max_tokens


def make_engine(
    model: PreTrainedModel, precision: str | None, batch: int, decode_graphs: str = "auto"
) -> EmbeddedEngine:
    """The engine on its own copy of `model`: as `inference.precision` builds it, or (None) on the model's dtype and
    PyTorch's products."""
    model = copy.deepcopy(model)
    formats: tuple[str, ...] = ("blas",)
    if precision is not None:
        apply_precision(model, precision)
        param = next(model.parameters())
        formats = projection_formats(precision, param.dtype, param.device)
    engine = EmbeddedEngine(
        model, eos_token_ids=(), pad_token_id=PAD, max_batch_size=batch, weight_formats=formats,
        decode_graphs=decode_graphs,
    )  # fmt: skip
    times = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in engine.native.format_times.items())
    print(f"  thermik {precision or 'model dtype'}: projection weights {engine.native.weight_format}" + (
        f" (timed: {times})" if times else ""))  # fmt: skip
    return engine


def engine_names(args: argparse.Namespace) -> list[str]:
    names = [f"thermik {args.precision or args.dtype}"]
    return [*names, f"thermik {args.compare}"] if args.compare else names


def throughput_row(model: PreTrainedModel, hf_model: PreTrainedModel, batch: int, args: argparse.Namespace) -> dict:
    """Print transformers vs thermik (and the --compare engine) at `batch` prompts; return {name: tok/s}."""
    prompt_ids = prompts(batch, args.prompt_tokens, model.config.vocab_size, args.seed)
    names = engine_names(args)
    engines = dict(zip(names, [make_engine(model, p, batch) for p in (args.precision, args.compare)], strict=False))
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0)] * batch
    sampled: list[list[int]] = []

    def run(engine: EmbeddedEngine) -> Callable[[], None]:
        def ours() -> None:
            gens = engine.generate_batch(prompt_ids, params)
            assert all(len(g.token_ids) == args.max_tokens for g in gens)
            if engine is engines[names[0]]:
                sampled[:] = [g.token_ids for g in gens]

        return ours

    sides = {"transformers generate": lambda: hf_generate(hf_model, prompt_ids, args.max_tokens)}
    sides.update({name: run(e) for name, e in engines.items()})
    best = best_of(args.repeats, sides)
    tokens = batch * args.max_tokens
    rates = {name: tokens / seconds for name, seconds in best.items()}
    hf = rates["transformers generate"]
    print(f"throughput ({args.name}, {args.dtype}, {args.device}, batch {batch}, {args.max_tokens} sampled tokens, "
          f"best of {args.repeats}):")  # fmt: skip
    print(f"  transformers generate {hf:8.0f} tok/s")
    for name in names:
        print(f"  {name:21s} {rates[name]:8.0f} tok/s   ratio to transformers {rates[name] / hf:.2f}x")
    if args.compare:
        print(f"  {names[1]} / {names[0]}: {rates[names[1]] / rates[names[0]]:.2f}x")
        rows = min(KL_ROWS, batch)
        kl = mean_token_kl([e.native for e in engines.values()], prompt_ids[:rows], sampled[:rows])
        print(f"  mean per-token KL({names[0]} || {names[1]}) over {rows} x {args.max_tokens} tokens: {kl:.5f}")
    for engine in engines.values():
        asyncio.run(engine.close())
    return rates


KL_ROWS = 8  # sequences teacher-forced through both engines for the KL


@torch.inference_mode()
def mean_token_kl(natives: list[NativeCausalLM], prompt_ids: list[list[int]], tokens: list[list[int]]) -> float:
    """Mean over tokens of KL(p || q), p and q the next-token distributions of the two forwards on the same
    sequences (each prompt prefilled into its own slot, then the sampled tokens decoded as one batch)."""
    logprobs = []
    for native in natives:
        cache = native.new_cache(len(prompt_ids), max(map(len, prompt_ids)) + len(tokens[0]))
        steps = []
        for slot, prompt in enumerate(prompt_ids):
            at = torch.tensor([len(prompt) - 1])
            steps.append(native.forward(torch.tensor([prompt]), torch.tensor([slot]), torch.tensor([0]), at, cache))
        rows = [torch.cat(steps).log_softmax(-1)]
        slots, starts = torch.arange(len(prompt_ids)), torch.tensor([len(p) for p in prompt_ids])
        zero = torch.zeros(len(prompt_ids), dtype=torch.long)
        for t in range(len(tokens[0]) - 1):
            step = torch.tensor([[row[t]] for row in tokens])
            rows.append(native.forward(step, slots, starts + t, zero, cache).log_softmax(-1))
        logprobs.append(torch.stack(rows))
    p, q = logprobs
    return float((p.exp() * (p - q)).sum(-1).mean())


def projection_shapes(model: PreTrainedModel) -> list[tuple[str, int, int, int]]:
    """(name, in, out, count per decode step) of the matmuls of one decode step (fused as the engine runs them)."""
    cfg = model.config
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    layers = cfg.num_hidden_layers
    return [
        ("q/k/v", hidden, (heads + 2 * kv_heads) * head_dim, layers),
        ("o", heads * head_dim, hidden, layers),
        ("gate/up", hidden, 2 * cfg.intermediate_size, layers),
        ("down", cfg.intermediate_size, hidden, layers),
        ("lm head", hidden, cfg.vocab_size, 1),
    ]


def matmul_seconds(rows: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Time of one `rows x k @ k x n` in `dtype`: the fastest of plain torch, (bfloat16) oneDNN's prepacked linear and
    (float32, where they run here) thermik's packed float32 and bfloat16-stored weights. The calls cycle through
    copies of the weight filling WEIGHT_BYTES (more than the last-level cache), so weights come from memory as in a
    decode step, which reads the whole model. Each call is timed alone and the 20th percentile is kept: on a shared
    machine a 2-thread call now and then waits a scheduler tick for a thread."""
    x, size = torch.randn(rows, k).to(dtype), k * n * torch.finfo(dtype).bits // 8
    weights = [torch.randn(n, k).to(dtype) for _ in range(min(256, max(1, -(-WEIGHT_BYTES // size))))]
    plain = [w.t().contiguous() for w in weights]
    sides: dict[str, Callable[[int], object]] = {"matmul": lambda i: x @ plain[i]}
    if can_prepack(dtype, x.device):
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        sides["prepacked"] = lambda i: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], "")
    if dtype == torch.float32 and gemm.available():
        for fmt in ("float32", "bf16"):
            kernels = [gemm.Packed(w, fmt) for w in weights]
            sides[fmt] = lambda i, kernels=kernels: kernels[i](x)
    calls = max(20 * repeats, 2 * len(weights))
    best = float("inf")
    with torch.inference_mode():
        for fn in sides.values():
            fn(0)
            times = []
            for c in range(calls):
                t0 = now()
                fn(c % len(weights))
                times.append(now() - t0)
            best = min(best, sorted(times)[len(times) // 5])
    return best


def roofline(model: PreTrainedModel, batch: int, args: argparse.Namespace) -> tuple[float, float]:
    """Print the matmul microbenchmark at the model's projection shapes; return (the roofline tok/s at `batch`,
    FLOPs per token)."""
    dtype = next(model.parameters()).dtype
    step, flops = 0.0, 0.0
    print(f"matmuls of one decode step at batch {batch} ({args.dtype}):")
    for name, k, n, count in projection_shapes(model):
        seconds = matmul_seconds(batch, k, n, dtype, args.repeats)
        step += count * seconds
        flops += count * 2 * batch * k * n
        print(f"  {name:8s} {batch:4d} x {k:5d} @ {k:5d} x {n:6d}  {2 * batch * k * n / seconds / 1e9:7.0f} GFLOP/s")
    rate = batch / step
    print(f"  {flops / batch / 1e9:.3f} GFLOP/token; all matmuls {step * 1e3:.2f} ms/step -> roofline {rate:.0f} tok/s")
    return rate, flops / batch


def llama_cpp_rows(args: argparse.Namespace, ours: dict[str, float]) -> None:
    """llama.cpp on each `--gguf` file at batch 1, skipped (said so) without llama-cpp-python or GGUF files."""
    if args.llama_cpp_path:
        sys.path.insert(0, args.llama_cpp_path)
    try:
        from llama_cpp import Llama
    except ImportError:
        print("  llama.cpp: skipped (llama-cpp-python is not installed: scripts/build_llama_cpp.sh)")
        return
    if not args.gguf:
        print("  llama.cpp: skipped (no --gguf file)")
    for gguf in args.gguf:
        if not Path(gguf).is_file():
            print(f"  llama.cpp: skipped (no GGUF file at {gguf})")
            continue
        rate = llama_cpp_rate(Llama, gguf, args)
        ratios = "   ".join(
            f"{name}/llama.cpp {tok_s / rate:.2f}x" for name, tok_s in ours.items() if "thermik" in name
        )
        print(f"  llama.cpp {Path(gguf).name}: {rate:8.0f} tok/s   {ratios}")


def llama_cpp_rate(llama: type, gguf: str, args: argparse.Namespace) -> float:
    """llama.cpp's tok/s sampling --max-tokens tokens at batch 1 (best of --repeats)."""
    llm = llama(model_path=gguf, n_ctx=args.prompt_tokens + args.max_tokens + 8, n_threads=torch.get_num_threads(),
                verbose=False)  # fmt: skip
    prompt = prompts(1, args.prompt_tokens, llm.n_vocab(), args.seed)[0]

    def run() -> None:
        llm.reset()
        for n, _ in enumerate(llm.generate(prompt, temp=1.0, top_k=0, top_p=1.0)):
            if n + 1 >= args.max_tokens:
                break

    return args.max_tokens / best_of(args.repeats, {"llama.cpp": run})["llama.cpp"]


def throughput(model: PreTrainedModel, args: argparse.Namespace) -> None:
    hf_model = copy.deepcopy(model)  # transformers runs on its own weights (the engine re-lays out the model's)
    batches = [args.batch, 1] if args.single_stream and args.batch != 1 else [args.batch]
    peak = 0.0
    if model.device.type == "cpu":  # the CPU's float32 FMA peak: what the CPU roofline lines compare with
        print(isa_line())
        rates = fma_peak(args.repeats)
        print(peak_line(rates))
        peak = rates["peak"]
    for batch in batches:
        rates = throughput_row(model, hf_model, batch, args)
        if args.roofline and peak:
            rate, flops = roofline(model, batch, args)
            gflop, peak_tok_s = flops / 1e9, peak / flops
            print(f"  FMA-peak roofline: {peak_tok_s:.0f} tok/s ({peak / 1e9:.0f} GFLOP/s / {gflop:.3f} GFLOP/token)")
            for name in engine_names(args):
                share, of_peak = rates[name] / rate, rates[name] / peak_tok_s
                line = f"{rates[name]:.0f} tok/s: {share:.1%} of matmul roofline, {of_peak:.1%} of FMA peak"
                print(f"  {name} {line}")
        if batch == 1:
            llama_cpp_rows(args, rates)


async def episode(engine: EmbeddedEngine, context: list[int], args: argparse.Namespace, k: int) -> int:
    history = list(context)
    params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0)
    for turn in range(3):
        gen = await engine.generate(history, params, session_id=f"ep{k}")
        history += gen.token_ids + [(k * 31 + turn * 7 + j) % 200 + 1 for j in range(args.obs_tokens)]
    return len(history)


def multi_turn(model: PreTrainedModel, args: argparse.Namespace) -> None:
    contexts = prompts(args.batch, args.context, model.config.vocab_size, args.seed + 1)
    engines = {
        "re-prefill every turn": EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD, reuse_prefixes=False),
        "session reuse": EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD),
    }

    def run(engine: EmbeddedEngine) -> Callable[[], None]:
        async def all_episodes() -> None:
            await asyncio.gather(*(episode(engine, c, args, k) for k, c in enumerate(contexts)))

        return lambda: asyncio.run(all_episodes())

    best = best_of(args.repeats, {name: run(e) for name, e in engines.items()})
    base, ours = best["re-prefill every turn"], best["session reuse"]
    print(
        f"3-turn episodes ({args.batch} concurrent, {args.context}-token prompt, {args.turn_tokens} tokens/turn, "
        f"{args.obs_tokens}-token observations):"
    )
    print(f"  re-prefill every turn {base:6.2f} s   session reuse {ours:6.2f} s   ratio {base / ours:.2f}x")


def weight_update(model: PreTrainedModel, args: argparse.Namespace) -> None:
    engine = EmbeddedEngine(model, eos_token_ids=(), pad_token_id=PAD)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = model.state_dict()

    @torch.no_grad()
    def plain_copy() -> None:
        for name, tensor in state.items():
            params[name].copy_(tensor)

    times: dict[str, list[float]] = {"state_dict copy": [], "engine.update_weights": []}
    sides = {"state_dict copy": plain_copy, "engine.update_weights": lambda: engine.update_weights_sync(state)}
    for _ in range(args.repeats * 10):
        for name, fn in sides.items():
            t0 = now()
            fn()
            times[name].append(now() - t0)
    base, ours = (statistics.median(times[n]) * 1e3 for n in sides)
    print(f"weight update ({sum(t.numel() for t in state.values()) / 1e6:.1f}M values, median of {args.repeats * 10}):")
    print(f"  state_dict copy {base:7.2f} ms   engine.update_weights {ours:7.2f} ms   ratio {ours / base:.2f}x")


@torch.inference_mode()
def reference_logprobs(hf_model: PreTrainedModel, prompt_ids: list[list[int]], tokens: list[list[int]]) -> list:
    """transformers' logprob of each sampled token (teacher-forced, right-padded batch), per row."""
    rows = [p + t for p, t in zip(prompt_ids, tokens, strict=True)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    logits = hf_model(input_ids=ids.to(hf_model.device), attention_mask=mask.to(hf_model.device)).logits
    out = []
    for i, (p, t) in enumerate(zip(prompt_ids, tokens, strict=True)):  # row by row: no float32 [B, L, V] copy
        logp = logits[i, len(p) - 1 : len(p) - 1 + len(t)].float().log_softmax(-1)
        out.append(logp.gather(-1, torch.tensor(t, device=logp.device)[:, None])[:, 0].tolist())
    return out


def parity(model: PreTrainedModel, args: argparse.Namespace) -> None:
    """Greedy tokens of the default engine vs its fixed-shape step run eagerly and the native forward, and each
    side's per-token logprobs vs transformers; prints the table (module docstring, 3.)."""
    hf_model = copy.deepcopy(model)
    prompt_ids = prompts(args.batch, args.prompt_tokens, model.config.vocab_size, args.seed)
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0)] * args.batch
    gens, seconds = {}, {}
    for mode in ("auto", "eager", "off"):
        engine = make_engine(model, args.precision, args.batch, mode)
        engine.prefill.reuse_prefixes = False  # every run prefills its prompts: the timed runs do the same work
        engine.generate_batch(prompt_ids, params)  # warm-up (captures the graphs)
        synchronize()
        t0 = now()
        gens[mode] = engine.generate_batch(prompt_ids, params)
        synchronize()
        seconds[mode] = now() - t0
        asyncio.run(engine.close())
    print(f"parity ({args.name}, {args.dtype}, {args.device}, batch {args.batch}, {args.max_tokens} greedy tokens):")
    for mode, rows in gens.items():
        same = sum(g.token_ids == a.token_ids for g, a in zip(rows, gens["auto"], strict=True))
        ref = reference_logprobs(hf_model, prompt_ids, [g.token_ids for g in rows])
        diffs = torch.tensor([g.logprobs for g in rows]) - torch.tensor(ref)
        print(f"  {mode:5s} {args.batch * args.max_tokens / seconds[mode]:8.0f} tok/s  rows identical to auto "
              f"{same}/{len(rows)}  |logprob - transformers| max {float(diffs.abs().max()):.4f} mean "
              f"{float(diffs.abs().mean()):.5f}")  # fmt: skip


def load(args: argparse.Namespace) -> PreTrainedModel:
    """The model in --dtype on --device: a --shape built with random weights, else --model or a fresh --preset."""
    dtype = getattr(torch, args.dtype)
    if args.shape:
        with torch.device(args.device):
            return AutoModelForCausalLM.from_config(shape_config(args.shape)).to(dtype).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()
    return model.to(args.device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen2-5m", choices=sorted(PRESETS))
    parser.add_argument("--model", default="", help="a local HF model directory instead of a fresh --preset")
    parser.add_argument("--shape", default="", choices=("", *SHAPES), help="a random-init published shape instead")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--single-stream", action="store_true", help="also measure throughput at batch 1")
    parser.add_argument("--no-roofline", dest="roofline", action="store_false", help="skip the matmul roofline")
    parser.add_argument("--precision", choices=PRECISIONS, help="build the engine as inference.precision does")
    parser.add_argument("--compare", choices=PRECISIONS, help="a second thermik engine in this precision")
    parser.add_argument("--gguf", nargs="*", default=[], help="GGUF files of the same model for llama.cpp rows")
    parser.add_argument("--llama-cpp-path", default="", help="a directory holding llama_cpp (build_llama_cpp.sh)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=384, help="prompt tokens of each multi-turn episode")
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--obs-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("throughput", "parity", "multi_turn", "weight_update"), nargs="*")
    add_clock_argument(parser)
    args = parser.parse_args(argv)
    set_clock(args.clock)
    if args.batch < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--batch, --max-tokens and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.name = args.shape or (Path(args.model).name if args.model else args.preset)
    model = load(args)
    gpu = f" ({torch.cuda.get_device_name(model.device)})" if model.device.type == "cuda" else ""
    threads = torch.get_num_threads()
    print(
        f"torch {torch.__version__}, {threads} threads, {args.name} in {args.dtype} on {args.device}{gpu}, "
        f"{args.clock} clock"
    )
    sections = (("throughput", throughput), ("parity", parity), ("multi_turn", multi_turn))
    for name, fn in (*sections, ("weight_update", weight_update)):
        if not args.only or name in args.only:
            fn(model, args)


if __name__ == "__main__":
    main()

"""Training forward+backward with each group's prompt run once (`trainer.shared_prefix`) against the plain forward.

One process, one freshly initialised preset model, one batch shaped like an agent RL step: `--prompts` groups of
`--group` samples, every sample its group's `--prompt-tokens`-token prompt followed by its own response of
`--min-response`..`--max-response` tokens. Both sides run `policy_update`'s forward and backward
(`training.update.batch_logprobs` -> a token-mean loss -> backward) over micro-batches of `--micro` rows,
alternately, `--repeats` times; the best time of each is reported, and the ratio is plain over shared.

    python benchmarks/shared_prefix_vs_plain.py                      # calculator-shaped: qwen2-1m, 12 x 8
    python benchmarks/shared_prefix_vs_plain.py --preset qwen2-5m --prompt-tokens 512
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from thermik.models.presets import PRESETS, init_model
from thermik.training.batch import TokenBatch
from thermik.training.update import batch_logprobs, micro_batches


def add_batch_arguments(
    parser: argparse.ArgumentParser, prompts: int, prompt_tokens: int, responses: tuple[int, int], repeats: int
) -> None:
    """The shape of the grouped batch (`grouped_batch`), the repeats and the seed."""
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=prompt_tokens)
    parser.add_argument("--min-response", type=int, default=responses[0])
    parser.add_argument("--max-response", type=int, default=responses[1])
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--seed", type=int, default=0)


def check_batch_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, *counts: int) -> None:
    """Exit with a usage error unless every count (the batch's and `counts`) is >= 1 and the response range is
    ordered."""
    if min(args.prompts, args.group, args.prompt_tokens, args.min_response, args.repeats, *counts) < 1:
        parser.error("every count must be >= 1")
    if args.max_response < args.min_response:
        parser.error("--max-response must be >= --min-response")


def grouped_batch(args: argparse.Namespace, vocab: int) -> TokenBatch:
    gen = torch.Generator().manual_seed(args.seed)
    rows, prompt_lens = [], []
    for _ in range(args.prompts):
        prompt = torch.randint(1, vocab, (args.prompt_tokens,), generator=gen).tolist()
        for _ in range(args.group):
            n = int(torch.randint(args.min_response, args.max_response + 1, (1,), generator=gen))
            rows.append(prompt + torch.randint(1, vocab, (n,), generator=gen).tolist())
            prompt_lens.append(len(prompt))
    width = max(len(r) for r in rows)
    ids, attention = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1)
    for i, (row, p) in enumerate(zip(rows, prompt_lens, strict=True)):
        ids[i, : len(row)], attention[i, : len(row)] = torch.tensor(row), 1
        mask[i, p - 1 : len(row) - 1] = 1
    zeros = torch.zeros_like(mask)
    return TokenBatch(ids, attention, mask, zeros, zeros, prompt_lens=torch.tensor(prompt_lens))


def train_pass(model: torch.nn.Module, batch: TokenBatch, micro: int, shared: bool) -> float:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    for _, mb in micro_batches(batch, micro):
        logp, _ = batch_logprobs(model, mb, 1.0, shared)
        (-(logp * mb.mask).sum() / batch.num_tokens).backward()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen2-1m", choices=sorted(PRESETS))
    add_batch_arguments(parser, prompts=12, prompt_tokens=200, responses=(30, 120), repeats=3)
    parser.add_argument("--micro", type=int, default=32)
    args = parser.parse_args()
    check_batch_arguments(parser, args, args.micro)
    with tempfile.TemporaryDirectory() as tmp:
        path = init_model(args.preset, Path(tmp) / args.preset, seed=args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).train()
    batch = grouped_batch(args, model.config.vocab_size)
    times: dict[bool, list[float]] = {False: [], True: []}
    for shared in (False, True):
        train_pass(model, batch, args.micro, shared)  # warm-up
    for _ in range(args.repeats):
        for shared in (False, True):
            times[shared].append(train_pass(model, batch, args.micro, shared))
    plain, ours = min(times[False]), min(times[True])
    tokens = int(batch.attention_mask.sum())
    print(
        f"{args.preset}, {args.prompts} x {args.group} samples, {args.prompt_tokens}-token prompts, responses "
        f"{args.min_response}-{args.max_response} tokens ({tokens} tokens), micro-batch {args.micro}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}:"
    )
    print(f"  plain forward+backward {plain:6.2f} s   shared prompts {ours:6.2f} s   ratio {plain / ours:.2f}x")


if __name__ == "__main__":
    main()

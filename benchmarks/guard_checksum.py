"""The weight-checksum guard after one weight sync: the C pass (kernels/checksum.c) against the PyTorch path.

Loads a local HF model (float32: the trainer's tensors, as a sync sends them), builds the embedded engine on a copy
in `--engine-dtype` (its projections are column slices of fused weights, as after a real sync), and times
`assembly.guards.weight_mismatches` over every tensor, alternately with the kernels on and off
(THERMIK_CPU_KERNELS=0), `--repeats` times; prints the best of each and the ratio.

    python benchmarks/guard_checksum.py --model runs/smollm2-sft/model
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM

from thermik.assembly.guards import weight_mismatches
from thermik.inference.embedded import EmbeddedEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local HF model directory")
    parser.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, local_files_only=True)
    sent = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    engine = EmbeddedEngine(model.to(getattr(torch, args.engine_dtype)), eos_token_ids=[0], pad_token_id=0)
    held = engine.model.state_dict()
    best = {"C kernel": float("inf"), "PyTorch": float("inf")}
    for _ in range(args.repeats):
        for name, flag in (("C kernel", "1"), ("PyTorch", "0")):
            os.environ["THERMIK_CPU_KERNELS"] = flag
            start = time.perf_counter()
            bad = weight_mismatches(sent, held)
            best[name] = min(best[name], time.perf_counter() - start)
            assert not bad, bad
    strided = sum(not t.is_contiguous() for t in held.values())
    print(f"{args.model}: {len(sent)} tensors, float32 sent, {args.engine_dtype} held ({strided} strided views)")
    for name, seconds in best.items():
        print(f"  {name:<9} {seconds:.3f} s")
    print(f"  PyTorch / C kernel: {best['PyTorch'] / best['C kernel']:.1f}x")


if __name__ == "__main__":
    main()

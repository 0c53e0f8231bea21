"""What one split-mode weight transfer costs: the trainer publishing `weights/step_<s>` and the server loading it.

For each model (--presets, built with `thermik model init`), it times --repeats rounds of
`runs/split/trainer.publish_state` (the trainer's side: safetensors file or shared-memory segment, atomic publish,
doorbell) and of the embedded engine loading that directory (`update_weights_sync`, what `POST /update_weights`
runs on the server), with split.weight_transfer = files and = shared_memory, and prints the median of each.
The HTTP request around the load is the same for both and left out.

    python benchmarks/split_weight_transfer.py --presets qwen2-1m qwen2-20m --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForCausalLM

from thermik.config.schema import RunConfig
from thermik.inference.embedded import EmbeddedEngine
from thermik.inference.shared_weights import unlink_segment
from thermik.runs.split.protocol import SplitLayout, published_steps
from thermik.runs.split.trainer import publish_state


def measure(model_dir: Path, transfer: str, repeats: int, out: Path) -> tuple[float, float, int]:
    """(median publish s, median load s, bytes of the published directory's files)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval(),
                            eos_token_ids=(), pad_token_id=0)  # fmt: skip
    cfg = RunConfig.model_validate(
        {"name": f"transfer-{transfer}", "output_dir": str(out), "split": {"weight_transfer": transfer}}
    )
    layout = SplitLayout(cfg.run_dir)
    publish, load = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        path = publish_state(state, layout, step, cfg)
        t1 = time.perf_counter()
        engine.update_weights_sync(path, step)
        publish.append(t1 - t0)
        load.append(time.perf_counter() - t1)
    size = sum(f.stat().st_size for f in path.iterdir())
    for published in published_steps(layout.weights):  # free the shared memory
        unlink_segment(layout.weights_dir(published))
    return statistics.median(publish), statistics.median(load), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen2-1m", "qwen2-20m"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'model':<12}{'transfer':<16}{'publish ms':>12}{'load ms':>10}{'total ms':>10}")
        for preset in args.presets:
            model_dir = Path(tmp) / preset
            cmd = [sys.executable, "-m", "thermik.cli", "model", "init", "--preset", preset, "--out", str(model_dir)]
            subprocess.run(cmd, check=True, capture_output=True)
            for transfer in ("files", "shared_memory"):
                publish, load, _ = measure(model_dir, transfer, args.repeats, Path(tmp) / "runs")
                total = (publish + load) * 1e3
                print(f"{preset:<12}{transfer:<16}{publish * 1e3:>12.1f}{load * 1e3:>10.1f}{total:>10.1f}")


if __name__ == "__main__":
    main()

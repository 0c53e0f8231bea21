"""Per-command overhead of the repo-repair sandbox: the same command bare and in the sandbox, alternating.

`python benchmarks/repo_repair_sandbox.py [--repeats 50] [--command true]` prints the median wall time of each
side, their difference (the target: <= 20 ms) and their ratio, the once-per-episode start (workspace, bwrap, the
executor) and bwrap alone. The bare side runs the command with `bash -c` in the same workspace; the sandbox side goes
through `Sandbox.run` (a request to the episode's executor inside bwrap, bash with its ulimits, output capture,
every other process of the sandbox killed afterwards).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from thermik.tasks.repo_repair.sandbox import Sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    bare, boxed, floor = [], [], []
    start = time.perf_counter()
    with Sandbox(None) as box:
        box.run(args.command)
        first = time.perf_counter() - start
        for _ in range(args.repeats):
            if box.isolation == "bwrap":  # the floor of any bwrap-per-command design: bwrap alone, no namespaces
                start = time.perf_counter()
                subprocess.run(["bwrap", "--ro-bind", "/", "/", "/bin/true"], capture_output=True, check=False)
                floor.append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run(["/bin/bash", "-c", args.command], cwd=box.workspace, capture_output=True, check=False)
            bare.append(time.perf_counter() - start)
            start = time.perf_counter()
            box.run(args.command)
            boxed.append(time.perf_counter() - start)
        isolation = box.isolation
    b, s = statistics.median(bare) * 1000, statistics.median(boxed) * 1000
    print(f"command {args.command!r}, {args.repeats} runs each, sandbox: {isolation}")
    print(f"bare median {b:.2f} ms, sandbox median {s:.2f} ms")
    print(f"overhead {s - b:.2f} ms per command (target <= 20 ms), ratio {s / b:.2f}x")
    if floor:
        print(f"bwrap --ro-bind / / /bin/true alone: median {statistics.median(floor) * 1000:.2f} ms")
    print(f"episode start (workspace, sandbox, executor) + first command: {first * 1000:.1f} ms")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

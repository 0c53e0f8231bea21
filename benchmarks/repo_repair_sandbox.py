"""Per-command overhead of the repo-repair sandbox: the same command bare and in the sandbox, alternating.

`python benchmarks/repo_repair_sandbox.py [--repeats 50] [--command true]` prints the median wall time of each
side, their difference (the target: <= 20 ms) and their ratio, and each side's child CPU time per command (on a
loaded machine the wall time is mostly waiting for a core). The bare side runs the command with `bash -c` in the
same workspace; the sandbox side goes through `Sandbox.run` (bwrap or unshare, setpriv when run as root, bash with
its ulimits, output capture, the process tree killed afterwards).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time

from thermik.tasks.repo_repair.sandbox import Sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    bare, boxed, floor, bare_cpu, boxed_cpu = [], [], [], 0.0, 0.0
    with Sandbox(None) as box:
        for _ in range(args.repeats):
            if box.isolation == "bwrap":  # the floor of any bwrap-per-command design: bwrap alone, no namespaces
                start = time.perf_counter()
                subprocess.run(["bwrap", "--ro-bind", "/", "/", "/bin/true"], capture_output=True, check=False)
                floor.append(time.perf_counter() - start)
            start, cpu = time.perf_counter(), _children_cpu()
            subprocess.run(["/bin/bash", "-c", args.command], cwd=box.workspace, capture_output=True, check=False)
            bare.append(time.perf_counter() - start)
            bare_cpu += _children_cpu() - cpu
            start, cpu = time.perf_counter(), _children_cpu()
            box.run(args.command)
            boxed.append(time.perf_counter() - start)
            boxed_cpu += _children_cpu() - cpu
        isolation = box.isolation
    b, s = statistics.median(bare) * 1000, statistics.median(boxed) * 1000
    print(f"command {args.command!r}, {args.repeats} runs each, sandbox: {isolation}")
    print(f"bare median {b:.2f} ms, sandbox median {s:.2f} ms")
    print(f"overhead {s - b:.2f} ms per command (target <= 20 ms), ratio {s / b:.2f}x")
    if floor:
        print(f"bwrap --ro-bind / / /bin/true alone: median {statistics.median(floor) * 1000:.2f} ms")
    per = 1000 / args.repeats
    print(
        f"CPU time of the child processes per command: bare {bare_cpu * per:.2f} ms, sandbox {boxed_cpu * per:.2f} ms"
    )
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()

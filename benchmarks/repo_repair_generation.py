"""Repo-repair task generation speed: validated tasks per minute, written into a fresh directory (no cache).

`python benchmarks/repo_repair_generation.py [--n 20] [--split train] [--seed 0]` builds, validates in the sandbox
and writes `--n` tasks with the default knobs (what `thermik synthesize --env repo_repair` and the example do), then
prints the wall time, tasks per minute, the candidates validated and the load average. `--records FILE` also writes
the records (instance_id, FAIL_TO_PASS, PASS_TO_PASS, patch) as JSON lines, to compare two implementations.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from thermik.config.schema import EnvConfig, RepoRepairConfig
from thermik.tasks.repo_repair import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--records", help="write the records here (JSON lines)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thermik-gen-bench-") as out:
        options = EnvConfig(name="repo_repair", repo_repair=RepoRepairConfig(tasks_dir=out))
        start = time.perf_counter()
        rows = generate.rows("repo_repair", args.n, args.seed, args.split, options)
        seconds = time.perf_counter() - start
        keys = [json.loads(line) for line in (Path(out) / "keys.jsonl").read_text().splitlines()]
    if args.records:
        fields = ("instance_id", "FAIL_TO_PASS", "PASS_TO_PASS", "patch")
        with open(args.records, "w") as f:
            for row in rows:
                record = row["reward_spec"]["ground_truth"]
                f.write(json.dumps({k: record[k] for k in fields}) + "\n")
    print(f"{len(rows)} {args.split} tasks ({len(keys)} keys tried) in {seconds:.1f} s: "
          f"{60 * len(rows) / seconds:.1f} tasks/minute, {seconds / len(rows):.2f} s per task")  # fmt: skip
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

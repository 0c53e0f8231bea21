"""The main job (`bash examples/calculator/run.sh`) for several seeds in two settings, one table.

Each run is the whole script in a process tree of its own, in sequence: model init, synthesis, the SFT warm-up (with
its held-out stop rule) and GRPO, each stage's wall time read from the script's `run.sh: stage NAME S s` lines, the
held-out success of the SFT checkpoint and of the policy after GRPO (200 problems sampled at temperature 1) from the
RL run's eval_before.json and eval_after.json, and the peak resident memory of the biggest process of the tree.

Settings (--settings, comma-separated):

- `float32`: trainer and engine in float32 with the kernels built for this CPU;
- `auto`: the default precision (bfloat16 engine and bf16-mixed trainer on a CPU with native bfloat16 dot products,
  float32 elsewhere);
- `avx2`: float32 as on an AVX2-only CPU (THERMIK_CPU_ISA=avx2: the kernels built with -march=x86-64-v3, PyTorch's
  and oneDNN's dispatch capped at AVX2).

The default is `float32,auto` on a CPU with native bfloat16 and `float32,avx2` elsewhere (where `auto` is float32).
Prints one row per run, then per setting the mean and range over seeds, and checks each run against the targets:
after GRPO >= 0.85 and >= 0.20 over its own SFT checkpoint.

    python benchmarks/main_job_matrix.py                          # 3 seeds x 2 settings (about 40 min on 2 cores)
    python benchmarks/main_job_matrix.py --seeds 0 --settings auto
    python benchmarks/main_job_matrix.py --collect --runs DIR     # the table of finished runs in DIR again
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "calculator" / "run.sh"
TARGET_SUCCESS = 0.85
TARGET_GAIN = 0.20
# setting -> (run.sh --precision, extra environment)
SETTINGS: dict[str, tuple[str, dict[str, str]]] = {
    "float32": ("float32", {}),
    "auto": ("auto", {}),
    "avx2": ("float32", {"THERMIK_CPU_ISA": "avx2"}),
}
STAGE_LINE = re.compile(r"^run\.sh: stage (\w+) ([0-9.]+) s$", re.MULTILINE)
PRECISION_LINE = re.compile(r"^thermik (?:embedded engine|trainer): .*$", re.MULTILINE)


@dataclass
class RunResult:
    setting: str
    seed: int
    cpu: str  # the CPU level the run saw (thermik.cpu.isa), simulated or not
    precision: str  # what the trainer and the engine said they run in
    sft_steps: int
    sft: float
    sft_se: float
    rl: float
    rl_se: float
    stages: dict[str, float]
    wall_s: float
    peak_rss_gb: float

    @property
    def gain(self) -> float:
        return self.rl - self.sft

    @property
    def meets_targets(self) -> bool:
        return self.rl >= TARGET_SUCCESS and self.gain >= TARGET_GAIN


def cpu_level(env: dict[str, str]) -> str:
    """What thermik's CPU probe reports under `env` (a fresh process: THERMIK_CPU_ISA is read there)."""
    code = "from thermik.cpu.isa import capabilities; print(capabilities().describe())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return proc.stdout.strip()


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return f"{names[0]}, {len(names)} logical CPUs" if names else platform.machine()


def precision_summary(log: str) -> str:
    """The trainer's and engine's one-line precision reports of the run, shortened to what they chose."""
    seen: list[str] = []
    for line in (m.group(0) for m in PRECISION_LINE.finditer(log)):
        head = line.split(" (", 1)[0].replace("thermik ", "")
        if head not in seen:
            seen.append(head)
    return "; ".join(seen)


def run_env(setting: str) -> dict[str, str]:
    """The environment of a run: this checkout's thermik, this interpreter's `thermik`, the setting's variables."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **SETTINGS[setting][1], "PYTHONPATH": str(REPO / "src"), "PATH": path}


def run_one(setting: str, seed: int, runs: Path, quick: bool) -> RunResult:
    """`bash examples/calculator/run.sh` for one seed and setting in runs/<setting>-s<seed>, its output in
    runs/<setting>-s<seed>.log."""
    env = run_env(setting)
    argv = ["bash", str(SCRIPT), "--seed", str(seed), "--precision", SETTINGS[setting][0]]
    argv += ["--runs", str(runs / f"{setting}-s{seed}")] + (["--quick"] if quick else [])
    log_path = runs / f"{setting}-s{seed}.log"
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)  # ru_maxrss: the biggest process of the tree, in KiB on Linux
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        sys.exit(f"{setting} seed {seed}: run.sh exited with {code}; its log {log_path} ends:\n{tail}")
    return read_result(setting, seed, runs, time.perf_counter() - start, usage.ru_maxrss / 2**20)


def read_result(
    setting: str, seed: int, runs: Path, wall_s: float | None = None, peak_rss_gb: float | None = None
) -> RunResult:
    """A finished run read back from runs/<setting>-s<seed> and its log. Without `wall_s` / `peak_rss_gb` (--collect)
    they come from `/usr/bin/time -v` lines in the log when the run was started under it, else the sum of the stages
    and 0."""
    out, text = runs / f"{setting}-s{seed}", (runs / f"{setting}-s{seed}.log").read_text()
    before = json.loads((out / "calculator-rl" / "eval_before.json").read_text())
    after = json.loads((out / "calculator-rl" / "eval_after.json").read_text())
    stages = {name: float(s) for name, s in STAGE_LINE.findall(text)}
    if wall_s is None:
        clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        parts = [float(x) for x in clock.group(1).split(":")] if clock else []
        wall_s = sum(x * 60**i for i, x in enumerate(reversed(parts))) if parts else sum(stages.values())
    if peak_rss_gb is None:
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        peak_rss_gb = int(rss.group(1)) / 2**20 if rss else 0.0
    return RunResult(
        setting=setting,
        seed=seed,
        cpu=cpu_level(run_env(setting)),
        precision=precision_summary(text),
        sft_steps=json.loads((out / "calculator-sft" / "sft_result.json").read_text())["steps"],
        sft=before["success"],
        sft_se=_se(before),
        rl=after["success"],
        rl_se=_se(after),
        stages=stages,
        wall_s=wall_s,
        peak_rss_gb=peak_rss_gb,
    )


def _se(result: dict) -> float:
    units = result.get("problems") or result["n"]
    p = result["success"]
    return (p * (1 - p) / units) ** 0.5 if units else 0.0


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def table(results: list[RunResult]) -> str:
    """The runs as a markdown table, then one summary row per setting (mean [min, max] over seeds)."""
    head = "| setting | seed | SFT steps | SFT | after GRPO | gain | SFT time | GRPO time | whole script | peak RSS |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in results:
        mark = "" if r.meets_targets else " ✗"
        lines.append(
            f"| {r.setting} | {r.seed} | {r.sft_steps} | {r.sft:.3f} ± {r.sft_se:.3f} "
            f"| {r.rl:.3f} ± {r.rl_se:.3f}{mark} "
            f"| {r.gain:+.3f} | {_minutes(r.stages.get('sft', 0))} | {_minutes(r.stages.get('rl', 0))} "
            f"| {_minutes(r.wall_s)} | {r.peak_rss_gb:.1f} GB |"
        )
    for setting in dict.fromkeys(r.setting for r in results):
        rs = [r for r in results if r.setting == setting]

        def span(values: list[float], fmt: str) -> str:
            return f"{statistics.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"

        lines.append(
            f"| **{setting}, mean [range]** | {len(rs)} seeds | {span([r.sft_steps for r in rs], '.0f')} "
            f"| {span([r.sft for r in rs], '.3f')} | {span([r.rl for r in rs], '.3f')} "
            f"| {span([r.gain for r in rs], '+.3f')} | {_minutes(statistics.mean(r.stages.get('sft', 0) for r in rs))} "
            f"| {_minutes(statistics.mean(r.stages.get('rl', 0) for r in rs))} "
            f"| {_minutes(statistics.mean(r.wall_s for r in rs))} (max {_minutes(max(r.wall_s for r in rs))}) "
            f"| {max(r.peak_rss_gb for r in rs):.1f} GB |"
        )
    return "\n".join(lines)


def default_settings() -> str:
    sys.path.insert(0, str(REPO / "src"))
    from thermik.cpu.isa import capabilities

    return "float32,auto" if capabilities().bf16_native else "float32,avx2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--settings", default="", help=f"comma-separated, of {', '.join(SETTINGS)}; default by CPU")
    parser.add_argument("--runs", default="runs/main-job-matrix", help="where the runs and their logs go")
    parser.add_argument("--quick", action="store_true", help="run.sh --quick: the plumbing only, numbers mean nothing")
    parser.add_argument("--collect", action="store_true", help="run nothing: the table of the finished runs in --runs")
    args = parser.parse_args()
    settings = (args.settings or default_settings()).split(",")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; valid: {', '.join(SETTINGS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = (REPO / args.runs).resolve() if not Path(args.runs).is_absolute() else Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    for setting in settings:
        for seed in seeds:
            if args.collect:
                if (runs / f"{setting}-s{seed}" / "calculator-rl" / "eval_after.json").is_file():
                    results.append(read_result(setting, seed, runs))
                continue
            results.append(run_one(setting, seed, runs, args.quick))
            r = results[-1]
            print(f"{setting} seed {seed}: {r.sft:.3f} -> {r.rl:.3f} in {_minutes(r.wall_s)}", file=sys.stderr)
            (runs / "results.json").write_text(json.dumps([asdict(x) for x in results], indent=1))
    print(f"\nCPU: {cpu_model()}; torch threads: {os.environ.get('OMP_NUM_THREADS') or 'all cores'}")
    for setting in dict.fromkeys(r.setting for r in results):
        r = next(x for x in results if x.setting == setting)
        print(f"  {setting}: {r.cpu}; {r.precision}")
    print(f"Held-out calculator, 200 problems sampled at temperature 1 (✗: below {TARGET_SUCCESS} or gain < +0.20):\n")
    print(table(results))
    met = sum(r.meets_targets for r in results)
    print(f"\n{met}/{len(results)} runs reach >= {TARGET_SUCCESS} after GRPO and >= +{TARGET_GAIN:.2f} over their SFT")


if __name__ == "__main__":
    main()

"""The summary of one `scripts/gpu_check.sh` run: stage table, the calculator's held-out table, the benchmarks' figures
and the RL runs' mismatch metrics, as OUT/summary.md and OUT/results.json.

    python scripts/gpu_check_report.py WORK_DIR OUT_DIR

WORK_DIR is the run's work directory (logs/stages.tsv, logs/<stage>.log, runs/<name>/metrics.jsonl); a stage that
failed or was cut short leaves a row saying so and the tail of its log.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ORDER = ("env", "tests", "calculator", "generate", "mfu", "rl_sync")  # tests and calculator run side by side
TIMED_OUT = {"124", "137"}
# Lines of the benchmark logs that carry the figures (benchmarks/trainer_mfu.py, benchmarks/engine_vs_hf.py).
MFU_LINES = ("torch ", "bf16 peak:", "  peak:", "train step on", "  variant", "  full ", "  lora ")
GENERATE_LINES = ("torch ", "throughput (", "  transformers generate", "  thermik ", "parity (", "  auto ", "  eager ",
                  "  off ")  # fmt: skip
RL_KEYS = ("mismatch/logprob_abs_diff", "guards/parity_max_abs_diff", "time/weight_sync", "guards/weight_checksum_s",
           "time/generate", "time/train", "time/step", "reward/mean")  # fmt: skip


def stages(work: Path) -> list[dict[str, str]]:
    path = work / "logs" / "stages.tsv"
    if not path.is_file():
        return []
    with path.open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return sorted(rows, key=lambda row: ORDER.index(row["stage"]) if row["stage"] in ORDER else len(ORDER))


def outcome(rc: str) -> str:
    return "ok" if rc == "0" else "timed out" if rc in TIMED_OUT else "no time left" if rc == "no-time" else "FAILED"


def metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def calculator(work: Path, name: str) -> dict[str, Any]:
    """The SFT result and the RL run's held-out evaluations (the first is 'before', the last 'after')."""
    out: dict[str, Any] = {"precision": name}
    sft = work / "runs" / f"calc-sft-{name}" / "sft_result.json"
    if sft.is_file():
        out["sft"] = json.loads(sft.read_text())
    records = metrics(work / "runs" / f"calc-rl-{name}")
    evals = [r for r in records if "eval/success" in r]
    steps = [r for r in records if "time/step" in r]
    if evals:
        out["before"] = {"step": evals[0]["step"], "success": evals[0]["eval/success"], "n": evals[0]["eval/n"]}
        out["after"] = {"step": evals[-1]["step"], "success": evals[-1]["eval/success"], "n": evals[-1]["eval/n"]}
    if len(evals) > 1:
        out["gain"], out["gain_se"] = gain(out["before"], out["after"])
    if steps:
        out["rl_steps"] = len(steps)
        out["rl_s_per_step"] = statistics.mean(r["time/step"] for r in steps)
    return out


def gain(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(after - before success, its standard error): two independent held-out samples of n problems each."""
    variance = sum(e["success"] * (1 - e["success"]) / max(e["n"], 1) for e in (before, after))
    return after["success"] - before["success"], variance**0.5


def rl_run(work: Path, name: str) -> dict[str, Any]:
    """Per metric of RL_KEYS over the run's steps: mean and max."""
    records = [r for r in metrics(work / "runs" / name) if "time/step" in r]
    out: dict[str, Any] = {"run": name, "steps": len(records)}
    for key in RL_KEYS:
        values = [r[key] for r in records if key in r]
        if values:
            out[key] = {"mean": statistics.mean(values), "max": max(values)}
    return out


def lines(work: Path, stage: str, prefixes: tuple[str, ...]) -> list[str]:
    path = work / "logs" / f"{stage}.log"
    text = path.read_text(errors="replace") if path.is_file() else ""
    return [line for line in text.splitlines() if line.startswith(prefixes)]


def tail(work: Path, stage: str, count: int = 30) -> str:
    path = work / "logs" / f"{stage}.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-count:]) if path.is_file() else "(no log)"


def env_lines(work: Path) -> list[str]:
    return lines(work, "env", ("python ", "gpu ", "mcp "))


def fmt(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else "-" if value is None else str(value)


def calculator_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| precision | SFT steps | SFT held-out | before RL | after RL | gain ± s.e. | RL steps | RL s/step |"]
    out.append("|---" * 8 + "|")
    for r in rows:
        sft, before, after = r.get("sft", {}), r.get("before", {}), r.get("after", {})
        after_text = fmt(after.get("success"))
        if after and before and after["step"] == before["step"]:
            after_text = "-"
        out.append(
            f"| {r['precision']} | {fmt(sft.get('steps'))} | {fmt(sft.get('success'))} | {fmt(before.get('success'))} "
            f"| {after_text} (step {after.get('step', '-')}, n {fmt(after.get('n'), 0)}) "
            f"| {fmt(r.get('gain'))} ± {fmt(r.get('gain_se'))} | {fmt(r.get('rl_steps'))} "
            f"| {fmt(r.get('rl_s_per_step'), 2)} |"
        )
    return out


def rl_table(rows: list[dict[str, Any]]) -> list[str]:
    header = "| run | steps | " + " | ".join(f"{k} mean / max" for k in RL_KEYS) + " |"
    out = [header, "|---" * (len(RL_KEYS) + 2) + "|"]
    for r in rows:
        cells = [f"{fmt(r[k]['mean'], 4)} / {fmt(r[k]['max'], 4)}" if k in r else "-" for k in RL_KEYS]
        out.append(f"| {r['run']} | {r['steps']} | " + " | ".join(cells) + " |")
    return out


def summary(work: Path) -> tuple[str, dict[str, Any]]:
    table = stages(work)
    calc = [calculator(work, name) for name in ("float32", "bf16")]
    rl = [rl_run(work, f"rl-sync-{name}") for name in ("bf16", "float32", "bf16-async")]
    results = {
        "environment": env_lines(work),
        "stages": table,
        "calculator": calc,
        "trainer_mfu": lines(work, "mfu", MFU_LINES),
        "generation": lines(work, "generate", GENERATE_LINES),
        "rl_sync": rl,
        "packing": lines(work, "packing", ("qwen2", "padded ")),
        "chunked_head": lines(work, "chunked_head", ("head ", "full:", "chunked:", "peak ratio")),
        "main_job": [line for line in tail(work, "main_job", 40).splitlines() if line.startswith(("|", "main_job:"))],
    }
    md = ["# thermik GPU check", "", *[f"    {line}" for line in results["environment"]], "", "## Stages", ""]
    md += ["| stage | result | seconds | limit |", "|---|---|---|---|"]
    md += [f"| {s['stage']} | {outcome(s['rc'])} (rc {s['rc']}) | {s['seconds']} | {s['limit']} |" for s in table]
    md += ["", "## Calculator main job (held-out success, temperature 1)", "", *calculator_table(calc)]
    md += ["", "## Trainer throughput and MFU", "", *[f"    {line}" for line in results["trainer_mfu"]]]
    md += ["", "## Generation throughput", "", *[f"    {line}" for line in results["generation"]]]
    md += ["", "## RL with weight sync (per step)", "", *rl_table(rl)]
    md += ["", "## Packed training forward (padded, varlen, masked)", "", *[f"    {x}" for x in results["packing"]]]
    md += ["", "## Chunked lm head (peak memory)", "", *[f"    {x}" for x in results["chunked_head"]]]
    if any(s["stage"] == "main_job" for s in table):
        md += ["", "## SmolLM2 example (held-out table, stage wall times)", "", *results["main_job"]]
    for s in table:
        if s["rc"] != "0":
            title = f"## {s['stage']}: {outcome(s['rc'])}, last lines of its log"
            md += ["", title, "", "```", tail(work, s["stage"]), "```"]
    return "\n".join(md) + "\n", results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    work, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    text, results = summary(work)
    (out / "summary.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`thermik eval` then 3 `thermik rl` steps on one environment source, on the tiny preset (tests/test_env_*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_thermik

SHORT = [
    "--eval.size", "4", "--rollout.max_generate_length", "8", "--rollout.max_input_length", "384",
    "--rollout.max_sequence_length", "420", "--monitor.progress", "false", "--env.max_turns", "2",
]  # fmt: skip


def eval_then_rl(tmp_path: Path, model_dir: Path, *args: str, timeout: float = 600, **env: str) -> dict[str, Any]:
    """Runs `thermik eval` (4 problems) and `thermik rl` (3 steps of 2 prompts x 2 samples) with `args`, checks that
    both ran all of it; returns {"eval": the eval.json scores, "steps": metrics.jsonl lines of the RL steps}."""
    common = ["--model.path", str(model_dir), "--output_dir", str(tmp_path), *SHORT, *args]
    done = run_thermik("eval", "--name", "ev", *common, timeout=timeout, **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    scores = json.loads((tmp_path / "ev" / "eval.json").read_text())
    steps = ["--trainer.steps", "3", "--trainer.prompts_per_step", "2", "--trainer.group_size", "2"]
    done = run_thermik("rl", "--name", "rl", *common, *steps, "--eval.before", "false", timeout=timeout, **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    lines = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward/mean" in x]
    assert scores["n"] == 4 and [x["step"] for x in steps] == [1, 2, 3], (scores, steps)
    return {"eval": scores, "steps": steps}

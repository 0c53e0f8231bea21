"""kill -9 of `thermik sft` at 10 random points, each followed by a resume: the final weights and every step's loss
equal an uninterrupted run's, and no kill leaves a partial checkpoint (sft_kill_chain.py holds the machinery;
about a minute on 2 shared cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


@pytest.mark.slow
def test_sft_killed_ten_times_then_resumed_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    env = cli_env(PYTHONPATH=f"{SRC}:{HERE}")
    argv = [sys.executable, str(HERE / "sft_kill_chain.py"), str(tiny_model_dir), str(tmp_path), "10", "31"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.splitlines()[-1])
    print(figures)
    assert figures["kills"] == 10, figures["kill_points"]
    assert figures["corrupt_checkpoints"] == []
    assert figures["steps_logged"] == list(range(1, 31)), "every step logged exactly once"
    assert figures["weights_identical"], figures["weights_max_abs_diff"]
    assert figures["losses_equal"]

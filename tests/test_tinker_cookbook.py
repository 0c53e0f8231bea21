"""tinker-cookbook 0.5.8, unmodified, in its own venv, runs its math_rl recipe (env arithmetic) against
`thermik tinker` on loopback, in sync mode and with max_steps_off_policy=2.

Slow: about 2 minutes per mode with SmolLM2-135M-Instruct on 2 CPU cores. Needs the cookbook's venv
(`bash scripts/tinker_cookbook_venv.sh`); the served model is SmolLM2-135M-Instruct when this machine has it
(tests/real_model.py), else the tiny preset (whose rewards are all equal, so its adapter gets no gradient).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from real_model import smollm2_dir
from safetensors.torch import load_file
from tinker_support import API_KEY, start_tinker

COOKBOOK_PYTHON = Path(
    os.environ.get("THERMIK_TINKER_COOKBOOK_VENV", Path.home() / ".cache/thermik/tinker-cookbook-venv")
) / "bin/python"  # fmt: skip

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not COOKBOOK_PYTHON.is_file(),
        reason="tinker-cookbook's venv is absent: make it with `bash scripts/tinker_cookbook_venv.sh`",
    ),
]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    model = smollm2_dir() or tiny_model_dir
    state = tmp_path_factory.mktemp("tinker_cookbook") / "state"
    server = start_tinker(model, state, "--server.api_key", API_KEY, "--service.num_threads", "1")
    yield server, model, state
    server.stop()


def _run_recipe(url: str, model: Path, log_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        f"base_url={url}", f"model_name={model}", "renderer_name=role_colon", "env=arithmetic",
        f"log_path={log_dir}", "behavior_if_log_dir_exists=delete", "max_steps=3", "groups_per_batch=4",
        "group_size=8", "lora_rank=8", "learning_rate=1e-4", "max_tokens=10", *extra,
    ]  # fmt: skip
    env = {**os.environ, "TINKER_API_KEY": API_KEY, "PYTHONPATH": ""}
    cmd = [str(COOKBOOK_PYTHON), "-m", "tinker_cookbook.recipes.math_rl.train", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.parametrize("mode", [(), ("max_steps_off_policy=2",)], ids=["sync", "off_policy_2"])
def test_math_rl_recipe_runs_three_steps(served, tmp_path: Path, mode: tuple[str, ...]) -> None:
    server, model, state = served
    done = _run_recipe(server.url, model, tmp_path / "log", *mode)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Training completed successfully" in done.stderr + done.stdout
    rows = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    numbers = [v for r in rows for v in r.values() if isinstance(v, int | float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    final = [json.loads(line) for line in (tmp_path / "log" / "checkpoints.jsonl").read_text().splitlines()][-1]
    run_id, _, name = final["state_path"].removeprefix("tinker://").split("/")
    adapter = load_file(str(state / "checkpoints" / run_id / "weights" / name / "adapter.safetensors"))
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b
    if smollm2_dir() is not None:  # B starts at 0: any optimizer step with a gradient moves it
        assert max(float(t.abs().max()) for t in lora_b) > 0
    assert all(torch.isfinite(t).all() for t in lora_b)

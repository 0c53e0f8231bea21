"""No dead code in src/thermik: vulture, configured in pyproject.toml's [tool.vulture], finds no unused name.

Tests, benchmarks, scripts and examples count as users. A name reached only by a string or a framework goes into
tests/dead_code_allowlist.py with its reason. Run it by hand with `vulture` in the repository root.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_src_has_no_dead_code() -> None:
    pytest.importorskip("vulture", reason="vulture is not installed: `pip install -r requirements/dev.txt`")
    res = subprocess.run(
        [sys.executable, "-m", "vulture"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode in (0, 3), res.stderr  # 3: dead code found; anything else is a vulture error
    dead = [line for line in res.stdout.splitlines() if line.startswith("src/")]
    assert dead == [], (
        "dead code (delete it, or allow-list it in tests/dead_code_allowlist.py with why):\n" + "\n".join(dead)
    )

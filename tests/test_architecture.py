"""The architecture holds: layers run one way (import-linter), every package is in a layer, functions stay short,
and there is one RL-step core."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "thermik"
MAX_FUNCTION_LINES = 60


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [name.strip() for layer in contract["layers"] for name in layer.split("|")]


def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((path, node))
    return found


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_package_sits_in_a_layer() -> None:
    """A new top-level package must be placed in the layers of pyproject.toml, or the contract cannot see it."""
    layered = {name.removeprefix("thermik.") for name in _layers()}
    top_level = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top_level |= {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    assert top_level - layered == set(), "place these in [tool.importlinter] layers (pyproject.toml)"


def test_no_function_is_longer_than_the_budget() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, node in _functions()
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_one_rl_step_core() -> None:
    """Every run mode calls thermik.runs.step.rl_step; no mode keeps a step function of its own."""
    cores = [f"{path.relative_to(ROOT)}:{node.lineno}" for path, node in _functions() if node.name == "rl_step"]
    assert cores == ["src/thermik/runs/step.py:" + cores[0].rsplit(":", 1)[1]], cores
    for mode in ("local", "ray", "split_trainer", "split_orchestrator"):
        source = (SRC / "runs" / f"{mode}.py").read_text()
        assert "rl_step(self, step)" in source, mode

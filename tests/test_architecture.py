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


# What the training layer may import: it knows batches, not engines, pools or tasks (docs/architecture.md).
TRAINING_MAY_IMPORT = (
    "algorithms",
    "config",
    "models",
    "atomic",
    "memory",
    "cpu",
    "errors",
    "training",
    "rollout.trajectory",
)


def _thermik_imports(path: Path) -> set[str]:
    """The thermik modules a file imports (at any depth: lazy imports inside functions count), without 'thermik.'."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name.removeprefix("thermik.") for name in names if name.startswith("thermik.")}


def _contract(source: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "forbidden" and c["source_modules"] == [source]]
    return contract


def test_training_imports_only_the_floors_below_assembly() -> None:
    """training/ imports algorithms, config, models, atomic, memory, cpu and the Trajectory type; the run's assembly
    (engines, envs, datasets, guards) sits above it in thermik.assembly. The allow-list sees every import, lazy ones
    too; the import-linter contract says the same to lint-imports."""
    allowed = tuple(f"{name}." for name in TRAINING_MAY_IMPORT) + TRAINING_MAY_IMPORT
    found = {
        f"{path.relative_to(ROOT)}: thermik.{name}"
        for path in sorted((SRC / "training").rglob("*.py"))
        for name in _thermik_imports(path)
        if not (name in TRAINING_MAY_IMPORT or name.startswith(allowed))
    }
    assert found == set()
    forbidden = set(_contract("thermik.training")["forbidden_modules"])
    layered = {name for name in _layers() if name != "thermik.training"}
    free = {f"thermik.{name}" for name in TRAINING_MAY_IMPORT if "." not in name}
    assert layered - free - {"thermik.rollout"} <= forbidden, "the contract must forbid every other package"


def test_cpu_package_is_the_ground_floor() -> None:
    """thermik.cpu (C kernels, their loader, the OpenMP helper, the precision probe) imports no other thermik package,
    and the layers contract puts it on the lowest floor."""
    imports = {name for path in (SRC / "cpu").rglob("*.py") for name in _thermik_imports(path)}
    assert {name for name in imports if not name.startswith("cpu")} == set()
    forbidden = set(_contract("thermik.cpu")["forbidden_modules"])
    assert {name for name in _layers() if name != "thermik.cpu"} <= forbidden
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    assert "thermik.cpu" in [name.strip() for name in layers[-1].split("|")]


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
    for mode in ("local", "ray", "split/trainer", "split/orchestrator"):
        source = (SRC / "runs" / f"{mode}.py").read_text()
        assert "rl_step(self, step)" in source, mode


MAX_CLASS_METHODS = 20
MAX_ENGINE_FILE_LINES = 400


def test_no_class_has_more_methods_than_the_budget() -> None:
    """A class with more jobs than a reader holds at once is split along them (as the embedded engine is)."""
    large = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_CLASS_METHODS:
                    large.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({len(methods)} methods)")
    assert large == []


def test_the_embedded_engine_is_small_files() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in sorted((SRC / "inference" / "embedded").glob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_ENGINE_FILE_LINES
    ]
    assert long == []


def test_the_step_core_and_the_run_builder_reach_engines_through_the_interface() -> None:
    """runs/step.py (every mode's step) and runs/build.py (every mode's parts) know `inference.base` only."""
    for name in ("step.py", "build.py"):
        imported = {m for m in _thermik_imports(SRC / "runs" / name) if m.startswith("inference")}
        assert {m for m in imported if not m.startswith("inference.base")} == set(), name

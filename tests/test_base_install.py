"""A base install (no extras) runs the core commands, and an optional feature whose package is missing stops with one
line naming the extra. Missing packages are simulated by blocking their import (`sys.modules[name] = None`), the way
a base install lacks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[1]
BLOCKING_SITE = "import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"


def run_without(blocked: list[str], argv: list[str], tmp_path: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python ARGV` with the packages `blocked` unimportable (a sitecustomize on PYTHONPATH blocks them)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKING_SITE.format(blocked=blocked))
    env = cli_env(PYTHONPATH=f"{site}:{ROOT / 'src'}")
    return subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_base_install_check_passes_on_this_tree(tmp_path: Path) -> None:
    optional = ["peft", "fastapi", "ray", "tinker", "gguf", "accelerate", "openai", "bm25s", "wandb", "tensorboard"]
    res = run_without(optional, [str(ROOT / "scripts" / "check_base_install.py")], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "every core module imports on the base install" in res.stdout


def test_base_install_check_names_the_module_and_the_extra(tmp_path: Path) -> None:
    """The mutation CI must catch: `import peft` at the top of a core module."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copytree(ROOT / "scripts", tree / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tree)
    module = tree / "src" / "thermik" / "training" / "mixed_precision.py"
    module.write_text(module.read_text().replace("import torch\n", "import peft  # noqa: F401\nimport torch\n", 1))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKING_SITE.format(blocked=["peft"]))
    env = cli_env(PYTHONPATH=f"{site}:{tree / 'src'}")
    res = subprocess.run(
        [sys.executable, str(tree / "scripts" / "check_base_install.py")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 1
    assert "thermik.training.mixed_precision imports peft at module level" in res.stderr
    assert "peft belongs to the extra(s)" in res.stderr and "lora" in res.stderr


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        (["fastapi"], ["inference"], "serve"),
        (["peft"], ["rl", "--lora.enabled", "true"], "lora"),
        (["tensorboard"], ["rl", "--monitor.tensorboard", "true"], "sinks"),
        (["ray"], ["rl", "--distributed.enabled", "true"], "distributed"),
        (["fastapi"], ["rl", "--agent.command", "true"], "serve"),
    ],
)
def test_a_missing_extra_stops_with_one_line_naming_it(
    tmp_path: Path, tiny_model_dir: Path, blocked: list[str], args: list[str], extra: str
) -> None:
    argv = ["-m", "thermik.cli", *args, "--model.path", str(tiny_model_dir)]
    if args[0] == "rl":
        argv += ["--output_dir", str(tmp_path / "runs"), "--trainer.steps", "1", "--monitor.progress", "false"]
    res = run_without(blocked, argv, tmp_path, cwd=tmp_path)
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"thermik {args[0]}: " in res.stderr and f"[{extra}]" in res.stderr, res.stderr[-2000:]

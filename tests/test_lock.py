"""The lock files in requirements/ agree with pyproject.toml, and a pin changed without relocking is caught."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK_SCRIPT = ROOT / "scripts" / "lock.py"


def run_check(root: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(LOCK_SCRIPT), "--check", "--root", str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def copy_project(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    return tmp_path


def test_lock_matches_pyproject():
    result = run_check(ROOT)
    assert result.returncode == 0, result.stderr


def test_changed_pin_without_relock_fails_and_names_the_fix(tmp_path):
    root = copy_project(tmp_path)
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    assert '"ray==2.60.0"' in text
    pyproject.write_text(text.replace('"ray==2.60.0"', '"ray==2.61.0"'))
    result = run_check(root)
    assert result.returncode == 1
    assert "ray==2.60.0, outside pyproject.toml's 'ray==2.61.0'" in result.stderr
    assert "python scripts/lock.py" in result.stderr


def test_new_dependency_missing_from_the_lock_is_named(tmp_path):
    root = copy_project(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"rich>=13",', '"rich>=13", "cowsay>=6",'))
    result = run_check(root)
    assert result.returncode == 1
    assert "cowsay (cowsay>=6) is not in main.txt" in result.stderr
    assert "cowsay (cowsay>=6) is not in dev.txt" in result.stderr


def test_any_dependency_edit_invalidates_the_stamp(tmp_path):
    """A widened range still admits the locked version, but the lock no longer says what pyproject asks for."""
    root = copy_project(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"rich>=13"', '"rich>=12"'))
    result = run_check(root)
    assert result.returncode == 1
    assert "generated from other dependencies" in result.stderr

"""Grading a repo-repair episode: restore the test files from the task, then run FAIL_TO_PASS and PASS_TO_PASS.

The test files' contents come from the task's own repository at `base_commit` (read with git on that trusted
copy, never from the workspace's .git, which the agent could have rewritten); files named in `test_patch` are
restored first and the patch is then applied in the sandbox. Edits to tests therefore earn nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.tasks.repo_repair.sandbox import Sandbox
from thermik.tasks.repo_repair.tools import PYTEST, is_test_path

_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)", re.MULTILINE)
_PATCH_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.MULTILINE)
_PATCH_NAME = ".thermik-test.patch"


@dataclass
class Grade:
    passed: int
    total: int
    test_files_changed: int
    resolved: bool


def parse_outcomes(output: str) -> dict[str, str]:
    """pytest -rA's short summary: test id -> PASSED / FAILED / ERROR / ..."""
    return {test: outcome for outcome, test in _OUTCOME.findall(output)}


def _git(repo: Path, *args: str) -> bytes:
    cmd = ["git", "-c", "safe.directory=*", "-C", str(repo), *args]
    return subprocess.run(cmd, check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"}).stdout


def test_files(repo: Path, record: dict[str, Any]) -> dict[str, bytes | None]:
    """path -> content at base_commit (None: absent there) of every test file of the task's repository and every
    file the test patch touches."""
    base = record["base_commit"]
    listed = _git(repo, "ls-tree", "-r", "--name-only", base).decode().splitlines()
    paths = {p for p in listed if is_test_path(p)}
    paths |= {p for pair in _PATCH_FILE.findall(record.get("test_patch") or "") for p in pair}
    present = set(listed)
    return {p: _git(repo, "show", f"{base}:{p}") if p in present else None for p in sorted(paths)}


def _clear_path(workspace: Path, rel: str) -> Path:
    """The target of `rel` inside the workspace with every symlink or non-directory on the way removed, so a write
    there cannot leave the workspace."""
    current = workspace
    for part in Path(rel).parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
    target = current / Path(rel).name
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    return target


def restore_tests(workspace: Path, originals: dict[str, bytes | None]) -> int:
    """Put the task's test files back; returns how many the agent had changed."""
    changed = 0
    for rel, content in originals.items():
        current = workspace / rel
        now = current.read_bytes() if current.is_file() and not current.is_symlink() else None
        changed += now != content
        target = _clear_path(workspace, rel)
        if content is not None:
            target.write_bytes(content)
            os.chmod(target, 0o644)
    return changed


def grade(sandbox: Sandbox, repo: Path, record: dict[str, Any], finished: bool) -> Grade:
    """Restore the tests, apply the test patch, run FAIL_TO_PASS + PASS_TO_PASS in `sandbox` (on the workspace)."""
    workspace = sandbox.workspace
    changed = restore_tests(workspace, test_files(repo, record))
    patch = record.get("test_patch") or ""
    if patch:
        _clear_path(workspace, _PATCH_NAME).write_text(patch)
        sandbox.run(f"git apply {_PATCH_NAME}; rm -f {_PATCH_NAME}")
    tests = [*record["FAIL_TO_PASS"], *record["PASS_TO_PASS"]]
    outcomes = parse_outcomes(sandbox.run(pytest_command(tests)).output)
    passed = sum(outcomes.get(t) == "PASSED" for t in tests)
    return Grade(passed, len(tests), changed, finished and passed == len(tests))


def pytest_command(tests: list[str]) -> str:
    return f"{PYTEST} {' '.join(shlex.quote(t) for t in tests)}"

"""The repo-repair tools over one episode's sandbox: bash, read_file, edit_file, search, run_tests, finish.

Served by the per-episode MCP server (server.py) and called in-process by the env (`env.repo_repair.tools`). Files
are read and edited here, in the tools' process, only at paths whose real path stays inside the workspace (a
symlink pointing out is refused); commands run in the sandbox. A `ToolFailure` is the error text the model sees.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from thermik.envs.tool_use import function_schema
from thermik.tasks.repo_repair.sandbox import Sandbox, head_tail_text

PYTEST = "python -m pytest -rA -q -p no:cacheprovider"
"""Grading and validation: every test's outcome in the summary."""
TOOL_PYTEST = "python -m pytest -q --tb=short -p no:cacheprovider"
"""The run_tests tool: short tracebacks, only failures and errors in the summary (compact for small contexts)."""
_TIMING = re.compile(r" in \d+(\.\d+)?s( \(\d+:\d+:\d+\))?")
_MAX_SEARCH_RESULTS = 100
_MAX_FILE_BYTES = 2_000_000

SCHEMAS: list[dict[str, Any]] = [
    function_schema(
        "bash", "Run a bash command in the repository (no network; each call is a fresh shell).",
        {"command": {"type": "string"}, "timeout_s": {"type": "number"}}, ["command"],
    ),
    function_schema(
        "read_file", "Read a file of the repository with line numbers, optionally only lines start_line..end_line.",
        {"path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, ["path"],
    ),
    function_schema(
        "edit_file", "Replace the exact text old_str, which must occur exactly once in the file, by new_str.",
        {"path": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"}},
        ["path", "old_str", "new_str"],
    ),
    function_schema(
        "search", "Search the repository's files for a regular expression; prints path:line: text.",
        {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"],
    ),
    function_schema(
        "run_tests", "Run the test suite with pytest, or only the given test ids or files (space separated).",
        {"tests": {"type": "string"}}, [],
    ),
    function_schema("finish", "Submit the repository as it is now; ends the episode.", {}, []),
]  # fmt: skip
TOOL_NAMES = tuple(s["function"]["name"] for s in SCHEMAS)


class ToolFailure(Exception):
    """A tool call the model got wrong (its text is the error observation)."""


def is_test_path(path: str) -> bool:
    """Test files: under a tests/ or test/ directory, test_*.py, *_test.py, conftest.py."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return (
        any(p in ("tests", "test") for p in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


def inside(workspace: Path, path: str) -> Path:
    """The real path of `path` (relative to the workspace, or absolute under it / its in-sandbox path); raises
    ToolFailure when it leaves the workspace, a symlink included."""
    root = Path(os.path.realpath(workspace))
    text = str(path).strip()
    if text.startswith("/tmp/repo"):
        text = text.removeprefix("/tmp/repo").lstrip("/") or "."
    real = Path(os.path.realpath(root / text))
    if real != root and root not in real.parents:
        raise ToolFailure(f"{path}: outside the repository")
    return real


class RepoTools:
    """The tools of one episode. `sandbox.workspace` is the repository."""

    def __init__(self, sandbox: Sandbox, max_output_chars: int) -> None:
        self.sandbox = sandbox
        self.max_output_chars = max_output_chars
        self.finished = False

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool `name`; raises ToolFailure with the message for the model."""
        if name not in TOOL_NAMES:
            raise ToolFailure(f"unknown tool {name!r}; available: {', '.join(TOOL_NAMES)}")
        try:
            return getattr(self, name)(**arguments)
        except TypeError as exc:
            raise ToolFailure(f"{name}: bad arguments ({exc})") from None

    def bash(self, command: str, timeout_s: float | None = None) -> str:
        return self.sandbox.run(command, timeout_s).format()

    def read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        lines = self._text(path).splitlines()
        start = max(int(start_line), 1)
        end = len(lines) if end_line is None else min(int(end_line), len(lines))
        if start > max(end, 1) and lines:
            raise ToolFailure(f"{path} has {len(lines)} lines; asked for {start_line}..{end_line}")
        numbered = "\n".join(f"{i:>5}  {lines[i - 1]}" for i in range(start, end + 1))
        return head_tail_text(numbered, self.max_output_chars) if numbered else f"{path} is empty"

    def edit_file(self, path: str, old_str: str, new_str: str) -> str:
        text = self._text(path)
        count = text.count(old_str) if old_str else 0
        if count == 0:
            raise ToolFailure(f"{path}: old_str not found (it must match the file exactly, whitespace included)")
        if count > 1:
            raise ToolFailure(f"{path}: old_str occurs {count} times; include more lines around it to make it unique")
        inside(self.sandbox.workspace, path).write_text(text.replace(old_str, new_str, 1))
        line = text[: text.index(old_str)].count("\n") + 1
        return f"edited {path}: replaced {old_str.count(chr(10)) + 1} line(s) at line {line}"

    def search(self, pattern: str, path: str = ".") -> str:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolFailure(f"bad regular expression {pattern!r}: {exc}") from None
        root = Path(os.path.realpath(self.sandbox.workspace))
        hits: list[str] = []
        for file in _files(inside(self.sandbox.workspace, path)):
            try:
                lines = file.read_text(errors="replace").splitlines()
            except OSError:
                continue
            rel = file.relative_to(root)
            hits += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if regex.search(line)]
            if len(hits) >= _MAX_SEARCH_RESULTS:
                hits = [*hits[:_MAX_SEARCH_RESULTS], f"[... more matches not shown (first {_MAX_SEARCH_RESULTS})]"]
                break
        return head_tail_text("\n".join(hits), self.max_output_chars) if hits else f"no match for {pattern!r}"

    def run_tests(self, tests: str = "") -> str:
        result = self.sandbox.run(f"{TOOL_PYTEST} {tests}".strip())
        return _TIMING.sub("", result.format())

    def finish(self) -> str:
        self.finished = True
        return "submitted"

    def _text(self, path: str) -> str:
        real = inside(self.sandbox.workspace, path)
        if not real.is_file():
            raise ToolFailure(f"{path}: no such file")
        if real.stat().st_size > _MAX_FILE_BYTES:
            raise ToolFailure(f"{path}: larger than {_MAX_FILE_BYTES} bytes; use bash (head, sed -n) to read parts")
        return real.read_text(errors="replace")


def _files(start: Path) -> list[Path]:
    """Regular files under `start` (not following symlinks, .git skipped), sorted."""
    if start.is_file():
        return [start]
    found = []
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if (d != ".git" and not d.startswith(".")) or d == ".github")
        found += [Path(dirpath, f) for f in sorted(filenames) if not os.path.islink(os.path.join(dirpath, f))]
    return found

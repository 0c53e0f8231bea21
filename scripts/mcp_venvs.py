"""Third-party MCP servers in their own virtual environments (they pin their own `mcp`).

`ensure_venv(".venvs/mcp-server-time", ["mcp-server-time==2026.10.19"])` creates the venv with
`python -m venv --without-pip` and installs the requirements into it with our pip once; a marker file records what was
installed, so later calls return at once. A file lock makes concurrent callers wait for one
install. Run `python scripts/mcp_venvs.py [--root .venvs] [NAME ...]` to install the known
servers ahead of time.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

KNOWN_SERVERS: dict[str, tuple[str, ...]] = {
    "mcp-server-time": ("mcp-server-time==2026.10.19",),
    "mcp-server-git": ("mcp-server-git==2026.10.19",),
}
"""venv name -> pinned requirements; the console script of the same name is the server."""

_MARKER = "thermik-requirements.json"
INSTALL_TIMEOUT_S = 600.0


class VenvError(RuntimeError):
    """The venv could not be created or its packages installed (no index access, a bad pin)."""


def ensure_venv(path: str | Path, requirements: Sequence[str], timeout_s: float = INSTALL_TIMEOUT_S) -> Path:
    """Create `path` as a venv holding `requirements` unless it already does; returns the venv path."""
    venv = Path(path).resolve()
    venv.parent.mkdir(parents=True, exist_ok=True)
    wanted = sorted(requirements)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(venv) == wanted:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        try:
            # No pip inside the venv: our own pip installs into it (`--python`), which saves ~10 s per venv.
            _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout_s)
            pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
            _run([*pip, "--no-compile", "--disable-pip-version-check", *wanted], timeout_s)
        except VenvError:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / _MARKER).write_text(json.dumps(wanted))
    return venv


def server_command(venv: Path, script: str) -> str:
    """Path of a console script inside a venv."""
    return str(venv / "bin" / script)


def install_command(root: str | Path, name: str) -> str:
    """The shell command that installs a known server, for skip messages."""
    return f"python scripts/mcp_venvs.py --root {root} {name}"


def _installed(venv: Path) -> list[str] | None:
    try:
        return json.loads((venv / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def _run(cmd: list[str], timeout_s: float) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VenvError(f"{' '.join(cmd)} failed: {exc}") from exc
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
        raise VenvError(f"{' '.join(cmd)} exited with {out.returncode}: " + " | ".join(tail))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Install third-party MCP servers, each in its own venv.")
    parser.add_argument("--root", default=".venvs", help="Directory holding one venv per server.")
    parser.add_argument("names", nargs="*", default=list(KNOWN_SERVERS), help=f"Any of {sorted(KNOWN_SERVERS)}.")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in KNOWN_SERVERS:
            parser.error(f"unknown server {name!r}; known: {sorted(KNOWN_SERVERS)}")
        start = time.perf_counter()
        venv = ensure_venv(Path(args.root) / name, KNOWN_SERVERS[name])
        print(f"{name}: {server_command(venv, name)} ({time.perf_counter() - start:.1f}s)")


if __name__ == "__main__":
    main()

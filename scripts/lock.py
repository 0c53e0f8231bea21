"""Regenerate or check the lock files in `requirements/` (pip-tools: pip's own resolver and configuration).

    python scripts/lock.py            # regenerate after changing dependencies in pyproject.toml
    python scripts/lock.py --upgrade  # also move every pin to the newest release the ranges allow
    python scripts/lock.py --check    # fail when pyproject.toml and the lock files disagree (CI runs this)

Why pip-tools and not uv: pip-compile resolves with pip itself, so it reads this machine's pip configuration
(the local find-links directory that holds the CPU torch 2.13.0 wheel). See CONTRIBUTING.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare interpreter before the install: pip vendors packaging
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIP_TOOLS = "pip-tools==7.6.2"
REGENERATE = "python scripts/lock.py"
STAMP = "# pyproject.toml dependencies sha256: "
# Lock file -> extras it covers. main: the README's main job. dev: CI, tests, benchmarks, examples and docs' extras.
# The vllm extra is left out: it needs a CUDA torch and its own environment.
LOCKS: dict[str, tuple[str, ...]] = {
    "requirements/dev.txt": (
        "dev",
        "bench",
        "envs",
        "skyrl",
        "llm",
        "serve",
        "lora",
        "real",
        "distributed",
        "sinks",
        "tinker",
        "data",
        "reasoning-gym",
        "openenv",
    ),
    "requirements/main.txt": (),
}
# main is compiled under dev's pins, so both files agree on every package they share.
CONSTRAINED_BY = {"requirements/main.txt": "requirements/dev.txt"}


def dependency_fingerprint(pyproject: Path) -> str:
    """sha256 of everything in pyproject.toml that decides what gets installed."""
    project = tomllib.loads(pyproject.read_text())["project"]
    keys = ("requires-python", "dependencies", "optional-dependencies")
    return hashlib.sha256(json.dumps({k: project.get(k) for k in keys}, sort_keys=True).encode()).hexdigest()


def locked_versions(lock: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), re.MULTILINE)
    return {canonicalize_name(name): version for name, version in pins}


def direct_requirements(pyproject: Path, extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    lines = list(project.get("dependencies", [])) + [line for extra in extras for line in optional.get(extra, [])]
    return [Requirement(line) for line in lines]


def lock_problems(pyproject: Path, lock: Path, extras: tuple[str, ...]) -> list[str]:
    """What is wrong with one lock file against pyproject.toml; empty when it is current."""
    if not lock.exists():
        return [f"{lock.name} is missing"]
    problems = []
    stamp = next((line for line in lock.read_text().splitlines() if line.startswith(STAMP)), None)
    if stamp is None or stamp.removeprefix(STAMP).strip() != dependency_fingerprint(pyproject):
        problems.append(f"{lock.name} was generated from other dependencies than pyproject.toml lists now")
    pins = locked_versions(lock)
    environment = default_environment()
    for req in direct_requirements(pyproject, extras):
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name} ({req}) is not in {lock.name}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{lock.name} pins {req.name}=={version}, outside pyproject.toml's '{req}'")
    return problems


def check(root: Path) -> list[str]:
    pyproject = root / "pyproject.toml"
    return [p for name, extras in LOCKS.items() for p in lock_problems(pyproject, root / name, extras)]


def stamp(lock: Path, fingerprint: str) -> None:
    lines = [line for line in lock.read_text().splitlines() if not line.startswith(STAMP)]
    first_pin = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    lines.insert(first_pin, f"{STAMP}{fingerprint}\n# check: python scripts/lock.py --check\n#")
    lock.write_text("\n".join(lines) + "\n")


def pip_compile() -> list[str]:
    """pip-compile from a pip-tools venv of its own, so the project's environment stays untouched."""
    venv = ROOT / ".venv-piptools"
    if not (venv / "bin" / "pip-compile").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PIP_TOOLS], check=True)
    return [str(venv / "bin" / "pip-compile")]


def regenerate(upgrade: bool) -> None:
    fingerprint = dependency_fingerprint(ROOT / "pyproject.toml")
    for name, extras in LOCKS.items():
        cmd = [*pip_compile(), "--quiet", "--strip-extras", "--allow-unsafe", "--no-emit-index-url"]
        cmd += ["--no-emit-find-links", "--output-file", name] + [f"--extra={e}" for e in extras]
        if name in CONSTRAINED_BY:
            cmd.append(f"--constraint={CONSTRAINED_BY[name]}")
        if upgrade:
            cmd.append("--upgrade")
        subprocess.run([*cmd, "pyproject.toml"], check=True, cwd=ROOT)
        stamp(ROOT / name, fingerprint)
        print(f"wrote {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the lock files match pyproject.toml")
    parser.add_argument("--upgrade", action="store_true", help="move every pin to the newest allowed release")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root to check (default: this checkout)")
    args = parser.parse_args()
    if not args.check:
        regenerate(args.upgrade)
    problems = check(args.root)
    for problem in problems:
        print(f"lock out of date: {problem}", file=sys.stderr)
    if problems:
        print(f"Regenerate the lock with `{REGENERATE}` and commit requirements/.", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Check that a base install (requirements/main.txt + `-e .`, no extras) can import every core module of thermik.

Run it with the base install's Python: it imports each module under `thermik` except those listed in
OPTIONAL_MODULES (which belong to an extra), and fails naming the module that imports an optional package at module
level and the extra that package belongs to. `.ci/run` runs it in a fresh base venv before the main job's short form.

    python scripts/check_base_install.py
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import tomllib
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules that are the optional features themselves: importing them needs their extra.
OPTIONAL_MODULES: dict[str, str] = {
    "thermik.inference.server": "serve",
    "thermik.capture": "serve",  # per-episode endpoints, served by fastapi
    "thermik.agents.episode": "serve",  # harness and verifiers episodes over a capture endpoint
    "thermik.inference.vllm_engine": "vllm",
    "thermik.inference.vllm_worker": "vllm",
    "thermik.tinker": "tinker",
    "thermik.training.lora": "lora",
}


def _extras_by_package() -> dict[str, list[str]]:
    """Import name (as a distribution name normalised to an identifier) -> the extras that install it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = {}
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
            extras.setdefault(re.sub(r"[-.]", "_", name).lower(), []).append(extra)
    return extras


def _optional(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in OPTIONAL_MODULES)


def _importer(tb: traceback.StackSummary) -> str:
    """The thermik module whose own import statement failed: the innermost frame inside src/thermik."""
    src = ROOT / "src"
    for frame in reversed(tb):
        path = Path(frame.filename)
        if path.is_relative_to(src / "thermik"):
            return ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
    return "?"


def check() -> list[str]:
    import thermik

    extras = _extras_by_package()
    problems: dict[tuple[str, str], str] = {}  # (importing module, package) -> the message, once each
    for info in pkgutil.walk_packages(thermik.__path__, "thermik."):
        if _optional(info.name):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            package = (e.name or "").split(".")[0]
            where = _importer(traceback.extract_tb(e.__traceback__))
            owner = extras.get(package.lower())
            fix = (
                f"{package} belongs to the extra(s) {', '.join(owner)} (pyproject.toml): import it inside the function "
                f"that uses the feature, or list {where} in OPTIONAL_MODULES with its extra"
                if owner
                else f"{package} is in no extra: add it to pyproject.toml's dependencies or to an extra"
            )
            problems.setdefault(
                (where, package), f"{where} imports {package} at module level (reached from {info.name}); {fix}"
            )
    return list(problems.values())


def main() -> int:
    problems = check()
    for line in problems:
        print(f"check_base_install: {line}", file=sys.stderr)
    if not problems:
        print("check_base_install: every core module imports on the base install")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

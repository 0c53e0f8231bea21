"""Dataset rows (docs/architecture.md, 'Contracts'): load/validate/write jsonl and parquet.

A row: {"data_source": str, "env_class": str, "prompt": [messages], "reward_spec": dict, "extra_info": dict}.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from thermik.errors import ThermikError

REQUIRED_FIELDS: dict[str, type] = {
    "data_source": str,
    "env_class": str,
    "prompt": list,
    "reward_spec": dict,
    "extra_info": dict,
}
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
_JSON_COLUMNS = ("reward_spec", "extra_info")
"""Stored as JSON strings in parquet: their shapes differ per env and empty structs cannot be written."""


class DatasetError(ThermikError, ValueError):
    """A dataset file or row is malformed; the message names the file, row and field."""


def validate_row(row: Any, where: str = "row") -> dict[str, Any]:
    """Check one row's fields and types; return it unchanged. `where` prefixes the error (e.g. 'data.jsonl row 3')."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name, kind in REQUIRED_FIELDS.items():
        if name not in row:
            raise DatasetError(f"{where}: missing field {name!r} (required: {', '.join(REQUIRED_FIELDS)})")
        if not isinstance(row[name], kind):
            raise DatasetError(f"{where}: field {name!r} must be {kind.__name__}, got {type(row[name]).__name__}")
    if not row["prompt"]:
        raise DatasetError(f"{where}: field 'prompt' is empty")
    for i, message in enumerate(row["prompt"]):
        if not isinstance(message, dict):
            raise DatasetError(f"{where}: prompt[{i}] must be an object, got {type(message).__name__}")
        if message.get("role") not in MESSAGE_ROLES:
            raise DatasetError(f"{where}: prompt[{i}].role must be one of {MESSAGE_ROLES}, got {message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise DatasetError(f"{where}: prompt[{i}].content must be a string")
    return row


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate rows from a .jsonl or .parquet file. Row numbers in errors are 1-based."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    if path.suffix == ".jsonl":
        records = read_jsonl(path)
    elif path.suffix == ".parquet":
        records = _read_parquet(path)
    else:
        raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r}; expected .jsonl or .parquet")
    return [validate_row(row, f"{path} row {i}") for i, row in enumerate(records, start=1)]


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Validate and write rows to .jsonl or .parquet atomically (temp file, then rename)."""
    path = Path(path)
    rows = [validate_row(row, f"row {i}") for i, row in enumerate(rows, start=1)]
    if path.suffix == ".jsonl":
        return write_jsonl(path, rows)
    if path.suffix == ".parquet":
        return _write_parquet(path, rows)
    raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r}; expected .jsonl or .parquet")


def read_jsonl(path: str | Path) -> list[Any]:
    """One JSON value per non-blank line; a bad line names its line number."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path} line {line_no}: invalid JSON: {exc.msg}") from None
    return records


def write_jsonl(path: str | Path, records: Iterable[Any]) -> Path:
    """Write one JSON value per line; readers see the old file or the complete new one, never a partial one."""
    path = Path(path)
    with _atomic(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


@contextlib.contextmanager
def _atomic(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temp file in the target's directory, fsync, then os.replace onto the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DatasetError("reading or writing .parquet needs pyarrow: pip install pyarrow (or use .jsonl)") from None
    return pyarrow


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    rows = read_parquet_records(path)
    for i, row in enumerate(rows, start=1):
        for name in _JSON_COLUMNS:
            if isinstance(row.get(name), str):
                try:
                    row[name] = json.loads(row[name])
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path} row {i}: field {name!r} holds invalid JSON: {exc.msg}") from None
        if isinstance(row.get("prompt"), list):
            # Parquet structs give every message every key; drop the keys a message did not have.
            row["prompt"] = [{k: v for k, v in m.items() if v is not None} for m in row["prompt"] if m is not None]
    return rows


def read_parquet_records(path: Path) -> list[dict[str, Any]]:
    """The records of a parquet file; a file that is not parquet is a DatasetError naming it."""
    pa = _pyarrow()
    try:
        return pa.parquet.read_table(path).to_pylist()
    except pa.ArrowException as exc:
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pa = _pyarrow()
    encoded = [{**row, **{name: json.dumps(row[name]) for name in _JSON_COLUMNS}} for row in rows]
    table = pa.Table.from_pylist(encoded)
    with _atomic(path, "wb") as f:
        pa.parquet.write_table(table, f)
    return path

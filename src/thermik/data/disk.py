"""Datasets on disk: .jsonl, .parquet, .arrow files and `datasets` save_to_disk directories, as thermik rows.

Files that already hold thermik rows (.jsonl, .parquet) are read by thermik.data.dataset; .arrow files and
save_to_disk directories are read through the optional `datasets` package (extra `data`), offline. A column
mapping (`DataColumnsConfig`) turns another schema (a question column, an answer column) into rows for the run's
environment. docs/environments.md, "Datasets on disk".
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from thermik.config.schema import DataColumnsConfig
from thermik.data.dataset import DatasetError, load_rows, read_jsonl, read_parquet_records, validate_row

ROW_FORMATS = (".jsonl", ".parquet")
"""Formats thermik reads without `datasets` (thermik.data.dataset)."""
DATASETS_FORMATS = (".arrow",)
"""Single files read through `datasets`; a directory is a save_to_disk dataset."""


def load_rows_from(path: str | Path, columns: DataColumnsConfig, env_name: str, split: str) -> list[dict[str, Any]]:
    """The rows of one dataset on disk. `columns.prompt` empty: the file holds thermik rows; else each record is
    mapped (`map_record`) onto a row of `env_name`. `split`: the split of a save_to_disk DatasetDict."""
    path = Path(path)
    if not columns.prompt and path.suffix in ROW_FORMATS:
        return load_rows(path)
    records = read_records(path, split)
    if not columns.prompt:
        return [validate_row(_decode_json_columns(r), f"{path} row {i}") for i, r in enumerate(records, start=1)]
    source = columns.data_source or path.stem
    return [map_record(r, columns, env_name, source, f"{path} row {i}") for i, r in enumerate(records, start=1)]


def read_records(path: Path, split: str) -> list[dict[str, Any]]:
    """Every record of a .jsonl, .parquet or .arrow file or a save_to_disk directory, as plain dicts."""
    if path.is_dir():
        return _load_from_disk(path, split)
    if not path.is_file():
        raise DatasetError(
            f"dataset not found: {path} (a .jsonl, .parquet or .arrow file, or a save_to_disk directory)"
        )
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".parquet":
        return read_parquet_records(path)
    if path.suffix in DATASETS_FORMATS:
        dataset = _datasets().load_dataset("arrow", data_files=str(path), split="train")
        return dataset.to_list()
    raise DatasetError(
        f"{path}: unsupported dataset format {path.suffix!r}; expected .jsonl, .parquet, .arrow or a save_to_disk "
        "directory"
    )


def map_record(
    record: dict[str, Any], columns: DataColumnsConfig, env_name: str, source: str, where: str
) -> dict[str, Any]:
    """One record of another schema as a thermik row: the prompt column becomes the prompt messages, the answer
    column `reward_spec.ground_truth`, every other column goes to `extra_info`."""
    prompt = _column(record, columns.prompt, where)
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        messages = [{k: v for k, v in m.items() if v is not None} for m in prompt]
    else:
        raise DatasetError(
            f"{where}: column {columns.prompt!r} must hold a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    if columns.system_prompt:
        messages = [{"role": "system", "content": columns.system_prompt}, *messages]
    reward_spec = {"ground_truth": _column(record, columns.answer, where)} if columns.answer else {}
    used = {columns.prompt, columns.answer}
    extra_info = {k: v for k, v in record.items() if k not in used and _is_json(v)}
    row = {
        "data_source": source,
        "env_class": env_name,
        "prompt": messages,
        "reward_spec": reward_spec,
        "extra_info": extra_info,
    }
    return validate_row(row, where)


def _column(record: dict[str, Any], name: str, where: str) -> Any:
    if name not in record:
        raise DatasetError(f"{where}: no column {name!r}; columns: {', '.join(sorted(record))}")
    return record[name]


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _decode_json_columns(record: dict[str, Any]) -> dict[str, Any]:
    """reward_spec / extra_info stored as JSON strings (as thermik writes parquet) become objects again."""
    out = dict(record)
    for name in ("reward_spec", "extra_info"):
        if isinstance(out.get(name), str):
            with contextlib.suppress(json.JSONDecodeError):  # validate_row names the field
                out[name] = json.loads(out[name])
    return out


def _load_from_disk(path: Path, split: str) -> list[dict[str, Any]]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: not a `datasets` save_to_disk directory ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetError(
                f"{path}: no split {split!r}; splits: {', '.join(loaded)} (set data.train_split / data.eval_split)"
            )
        loaded = loaded[split]
    return loaded.to_list()


def _datasets() -> Any:
    """The `datasets` package, offline: thermik never lets a load reach the Hub."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError(
            f".arrow files and save_to_disk directories are read with the `datasets` package ({exc}); install it "
            "with `pip install 'thermik[data]'`"
        ) from None
    datasets.config.HF_DATASETS_OFFLINE = True  # read at import: set again when datasets was imported before
    datasets.config.HF_HUB_OFFLINE = True
    return datasets

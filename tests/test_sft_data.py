"""SFT reads what RL reads: `train_path` / `eval_path` as .jsonl, .parquet, .arrow and save_to_disk directories
(Dataset, or DatasetDict with a chosen split), with RL's column mapping, through thermik.data.disk (docs/sft.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_thermik

from thermik.config.schema import DataColumnsConfig
from thermik.data.conversations import load_conversations
from thermik.data.dataset import DatasetError
from thermik.tasks.registry import generate_rows

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": str(i)}]} for i in range(4)
] + [{"prompt": "say 9", "completion": "9"}]
"""Both row formats in one dataset; a columnar file gives every row every column (None where a row has none)."""
EXPECTED = [c if "messages" in c else {"messages": [{"role": "user", "content": "say 9"},
            {"role": "assistant", "content": "9"}]} for c in CONVERSATIONS]  # fmt: skip


def _write_all(root: Path, records: list[dict[str, object]]) -> dict[str, tuple[Path, str]]:
    """The same records in every format: name -> (path, split to read)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    keys = list(dict.fromkeys(k for r in records for k in r))  # every row's columns (from_list takes the first's)
    table = datasets.Dataset.from_dict({k: [r.get(k) for r in records] for k in keys})
    table.to_parquet(root / "rows.parquet")
    with pa.OSFile(str(root / "rows.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.data.schema) as writer:
        writer.write_table(table.data.table)
    table.save_to_disk(str(root / "dataset"))
    datasets.DatasetDict({"train": table.select([0]), "chosen": table}).save_to_disk(str(root / "dict"))
    return {
        "jsonl": (root / "rows.jsonl", "train"),
        "parquet": (root / "rows.parquet", "train"),
        "arrow": (root / "rows.arrow", "train"),
        "save_to_disk": (root / "dataset", "train"),
        "datasetdict": (root / "dict", "chosen"),
    }


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "arrow", "save_to_disk", "datasetdict"])
def test_every_format_gives_the_same_conversations(tmp_path: Path, fmt: str) -> None:
    path, split = _write_all(tmp_path, CONVERSATIONS)[fmt]
    assert load_conversations(str(path), split=split) == EXPECTED


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "save_to_disk"])
def test_column_mapping_makes_prompt_completion_rows(tmp_path: Path, fmt: str) -> None:
    records = [{"question": "2+2?", "solution": "4", "id": 1}, {"question": "3+3?", "solution": "6", "id": 2}]
    path, split = _write_all(tmp_path, records)[fmt]
    columns = DataColumnsConfig(prompt="question", answer="solution", system_prompt="Be brief.")
    rows = load_conversations(str(path), columns, split)
    assert rows[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    with pytest.raises(DatasetError, match=r"row 1: no column 'answer'.*columns: id, question, solution"):
        load_conversations(str(path), DataColumnsConfig(prompt="question", answer="answer"), split)


def test_a_malformed_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS) + "{not json\n")
    with pytest.raises(DatasetError, match=rf"{path} line 6: invalid JSON"):
        load_conversations(str(path))
    path.write_text(json.dumps({"text": "no chat"}) + "\n")
    with pytest.raises(DatasetError, match=rf"{path} row 1: a row needs 'messages'"):
        load_conversations(str(path))


def test_a_missing_split_names_the_splits(tmp_path: Path) -> None:
    path, _ = _write_all(tmp_path, CONVERSATIONS)["datasetdict"]
    with pytest.raises(DatasetError, match="no split 'test'; splits: train, chosen"):
        load_conversations(str(path), split="test")


@pytest.mark.slow
def test_thermik_sft_trains_on_parquet_and_checks_a_save_to_disk_eval_set(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The command end to end: parquet conversations, held-out rows from a save_to_disk DatasetDict's chosen split."""
    train, _ = _write_all(tmp_path / "train", CONVERSATIONS)["parquet"]
    held_out = datasets.Dataset.from_list(generate_rows("reverse_text", 2, 0, split="eval"))
    datasets.DatasetDict({"heldout": held_out}).save_to_disk(str(tmp_path / "eval"))
    res = run_thermik(
        "sft", "--model.path", str(tiny_model_dir), "--output_dir", str(tmp_path / "runs"), "--name", "s",
        "--train_path", str(train), "--eval_path", str(tmp_path / "eval"), "--eval_split", "heldout",
        "--env.name", "reverse_text", "--eval_size", "2", "--eval_every", "1", "--max_steps", "1",
        "--batch_size", "2", "--progress", "false", timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "runs" / "s" / "sft_result.json").read_text())
    assert result["steps"] == 1 and result["success"] is not None
    assert any((tmp_path / "runs" / "s" / "trajectories").glob("eval_*.jsonl"))  # the held-out check ran

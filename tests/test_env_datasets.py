"""Datasets on disk (thermik.data.disk): .jsonl, .parquet, .arrow and save_to_disk directories in another schema,
mapped onto rows by `data.columns`, read offline; then `thermik eval` and 3 `thermik rl` steps on them."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from env_sources import eval_then_rl

from thermik.config.schema import DataColumnsConfig
from thermik.data.dataset import DatasetError
from thermik.data.disk import load_rows_from
from thermik.tasks.registry import generate_rows

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

COLUMNS = DataColumnsConfig(prompt="question", answer="answer", system_prompt="Answer with #### N.")


def _records(n: int, split: str) -> list[dict]:
    """GSM8K-shaped records (question, answer, a numeric id) from thermik's own problems."""
    rows = generate_rows("gsm8k", n, 0, split=split)
    return [
        {"question": r["prompt"][-1]["content"], "answer": r["reward_spec"]["ground_truth"], "id": i}
        for i, r in enumerate(rows)
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 12 train records in every format, and a DatasetDict with train and test splits."""
    root = tmp_path_factory.mktemp("disk")
    train, test = datasets.Dataset.from_list(_records(12, "train")), datasets.Dataset.from_list(_records(4, "eval"))
    train.to_json(root / "train.jsonl", lines=True)
    train.to_parquet(root / "train.parquet")
    with pa.OSFile(str(root / "train.arrow"), "wb") as sink, pa.ipc.new_stream(sink, train.data.schema) as writer:
        writer.write_table(train.data.table)
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(root / "dict"))
    test.to_parquet(root / "test.parquet")
    return {"jsonl": root / "train.jsonl", "parquet": root / "train.parquet", "arrow": root / "train.arrow",
            "dict": root / "dict", "test": root / "test.parquet"}  # fmt: skip


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: loads must be offline."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dataset load tried to connect: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_every_format_maps_to_the_same_rows_offline(files: dict[str, Path], no_network: None) -> None:
    by_format = {name: load_rows_from(files[name], COLUMNS, "gsm8k", "train") for name in ("jsonl", "parquet", "arrow")}
    by_format["dict"] = load_rows_from(files["dict"], COLUMNS, "gsm8k", "train")
    assert [r["prompt"] for r in by_format["dict"]] == [r["prompt"] for r in by_format["jsonl"]]
    assert [r["data_source"] for r in by_format.pop("dict")] == ["dict"] * 12  # the directory's name
    first = by_format["jsonl"]
    assert len(first) == 12
    assert all(rows == first for rows in by_format.values())
    row = first[0]
    assert row["env_class"] == "gsm8k" and row["data_source"] == "train"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["reward_spec"]["ground_truth"] == _records(12, "train")[0]["answer"]
    assert row["extra_info"] == {"id": 0}  # unmapped columns are kept


def test_a_datasetdict_split_is_chosen_by_name(files: dict[str, Path]) -> None:
    test_rows = load_rows_from(files["dict"], COLUMNS, "gsm8k", "test")
    assert [r["prompt"][-1]["content"] for r in test_rows] == [r["question"] for r in _records(4, "eval")]
    with pytest.raises(DatasetError, match=r"no split 'validation'; splits: train, test"):
        load_rows_from(files["dict"], COLUMNS, "gsm8k", "validation")


def test_thermik_rows_in_an_arrow_file_load_unmapped(tmp_path: Path) -> None:
    rows = generate_rows("reverse_text", 3, 0)
    table = datasets.Dataset.from_list(
        [{**r, "reward_spec": r["reward_spec"], "extra_info": {"k": 1}} for r in rows]
    ).data.table
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    loaded = load_rows_from(tmp_path / "rows.arrow", DataColumnsConfig(), "reverse_text", "train")
    assert [r["prompt"] for r in loaded] == [r["prompt"] for r in rows]
    assert [r["reward_spec"] for r in loaded] == [r["reward_spec"] for r in rows]


def test_bad_inputs_name_what_to_fix(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no column 'prompt'; columns: answer, id, question"):
        load_rows_from(files["parquet"], DataColumnsConfig(prompt="prompt"), "gsm8k", "train")
    with pytest.raises(DatasetError, match="dataset not found"):
        load_rows_from(tmp_path / "nope.arrow", COLUMNS, "gsm8k", "train")
    (tmp_path / "x.csv").write_text("a\n1\n")
    with pytest.raises(DatasetError, match=r"unsupported dataset format '.csv'"):
        load_rows_from(tmp_path / "x.csv", COLUMNS, "gsm8k", "train")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DatasetError, match="not a `datasets` save_to_disk directory"):
        load_rows_from(tmp_path / "empty_dir", COLUMNS, "gsm8k", "train")


def test_a_missing_datasets_package_names_the_extra(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DatasetError, match=r"pip install 'thermik\[data\]'"):
        load_rows_from(files["arrow"], COLUMNS, "gsm8k", "train")
    assert load_rows_from(files["jsonl"], COLUMNS, "gsm8k", "train")  # jsonl and parquet need no `datasets`


@pytest.mark.slow
def test_eval_and_rl_run_on_a_saved_dataset(files: dict[str, Path], tiny_model_dir: Path, tmp_path: Path) -> None:
    eval_then_rl(
        tmp_path, tiny_model_dir, "--env.name", "gsm8k",
        "--data.train_path", str(files["dict"]), "--data.eval_path", str(files["test"]),
        "--data.columns.prompt", "question", "--data.columns.answer", "answer",
    )  # fmt: skip

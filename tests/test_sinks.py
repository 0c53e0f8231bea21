"""The optional metric sinks write what metrics.jsonl holds: tensorboard event files and an offline wandb run are
read back."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from thermik.monitor.metrics import MetricsLogger

STEPS = {1: {"reward/mean": 0.25, "policy/kl": 0.01}, 2: {"reward/mean": 0.5, "policy/kl": 0.02}}


def test_tensorboard_event_files_hold_every_scalar(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        for step, metrics in STEPS.items():
            logger.log(step, metrics)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward/mean", "policy/kl"}
    for key in ("reward/mean", "policy/kl"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2]
        assert [e.value for e in events] == pytest.approx([STEPS[s][key] for s in (1, 2)])


def wandb_history(path: Path) -> list[dict]:
    """History rows of an offline wandb run file: the LevelDB log format (7-byte records: crc, length, type in 32 KiB
    blocks, after a 7-byte ':W&B' header) of protobuf `Record`s; wandb 0.31 ships no reader of its own."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending, rows = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # block trailer or padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_run_dir_holds_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with MetricsLogger(tmp_path, wandb_project="thermik-test") as logger:  # offline is the default mode
        for step, metrics in STEPS.items():
            logger.log(step, metrics)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    path, deadline = next(runs[0].glob("run-*.wandb")), time.monotonic() + 30
    while len(history := wandb_history(path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # wandb's service process may still be writing the file after finish() returns
    assert [(h["_step"], h["reward/mean"], h["policy/kl"]) for h in history] == [(1, 0.25, 0.01), (2, 0.5, 0.02)]


@pytest.fixture(autouse=True)
def _stop_wandb_service():
    """wandb leaves its service process (wandb-core) running in this process until teardown; later tests check
    that nothing they start outlives them, so stop it here."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()

"""What the Tinker service must not lose: futures, models, checkpoints and sessions, in SQLite (stdlib `sqlite3`).

A future is written `pending` when its request is accepted and `done`/`failed` with its payload when it finishes,
in one transaction each; a restarted server answers every finished future from here. A request's idempotency key
(model id + seq id, or sampling session + seq id) is unique: a retried request finds the future it already made.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS futures (
    request_id TEXT PRIMARY KEY, idem_key TEXT UNIQUE, kind TEXT NOT NULL, status TEXT NOT NULL,
    content_type TEXT, payload BLOB, extra TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    model_id TEXT PRIMARY KEY, idem_key TEXT UNIQUE, base_model TEXT NOT NULL, lora TEXT NOT NULL,
    boot TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    tinker_path TEXT PRIMARY KEY, model_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    directory TEXT NOT NULL, size_bytes INTEGER, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (session_id TEXT PRIMARY KEY, created REAL NOT NULL, heartbeat REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sampling_sessions (
    sampling_session_id TEXT PRIMARY KEY, idem_key TEXT UNIQUE, model_path TEXT, base_model TEXT NOT NULL);
"""


@dataclass(frozen=True)
class FutureRow:
    request_id: str
    kind: str
    status: str  # pending | done | failed
    content_type: str | None
    payload: bytes | None
    extra: dict[str, Any]


class Store:
    """One SQLite database file; every method is one short transaction, safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit is in the OS before it returns, so a killed server loses nothing; only a power loss
        # can drop the last commits. FULL fsyncs every commit, which benchmarks/tinker_overhead.py shows per step.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self.boot = uuid.uuid4().hex  # models of an earlier boot have lost their in-memory weights

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # futures
    def new_future(self, kind: str, idem_key: str | None, extra: dict[str, Any] | None = None) -> tuple[str, bool]:
        """(request id, created): an existing future with the same idempotency key is returned, not duplicated."""
        if idem_key is not None:
            rows = self._run("SELECT request_id FROM futures WHERE idem_key = ?", (idem_key,))
            if rows:
                return rows[0][0], False
        request_id = f"{kind}-{uuid.uuid4().hex}"
        self._run(
            "INSERT INTO futures VALUES (?, ?, ?, 'pending', NULL, NULL, ?, ?)",
            (request_id, idem_key, kind, json.dumps(extra or {}), time.time()),
        )
        return request_id, True

    def finish(self, request_id: str, status: str, content_type: str, payload: bytes) -> None:
        self._run(
            "UPDATE futures SET status = ?, content_type = ?, payload = ? WHERE request_id = ?",
            (status, content_type, payload, request_id),
        )

    def future(self, request_id: str) -> FutureRow | None:
        rows = self._run(
            "SELECT request_id, kind, status, content_type, payload, extra FROM futures WHERE request_id = ?",
            (request_id,),
        )
        if not rows:
            return None
        rid, kind, status, ctype, payload, extra = rows[0]
        return FutureRow(rid, kind, status, ctype, payload, json.loads(extra))

    def pending_ids(self) -> list[str]:
        return [r[0] for r in self._run("SELECT request_id FROM futures WHERE status = 'pending'")]

    # models
    def add_model(self, model_id: str, idem_key: str, base_model: str, lora: dict[str, Any]) -> None:
        self._run(
            "INSERT INTO models VALUES (?, ?, ?, ?, ?, ?)",
            (model_id, idem_key, base_model, json.dumps(lora), self.boot, time.time()),
        )

    def model(self, model_id: str) -> dict[str, Any] | None:
        rows = self._run("SELECT base_model, lora, boot FROM models WHERE model_id = ?", (model_id,))
        if not rows:
            return None
        return {"base_model": rows[0][0], "lora": json.loads(rows[0][1]), "boot": rows[0][2]}

    # checkpoints
    def add_checkpoint(self, tinker_path: str, model_id: str, kind: str, name: str, directory: str, size: int) -> None:
        self._run(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)",
            (tinker_path, model_id, kind, name, directory, size, time.time()),
        )

    def checkpoint_dir(self, tinker_path: str) -> str | None:
        rows = self._run("SELECT directory FROM checkpoints WHERE tinker_path = ?", (tinker_path,))
        return rows[0][0] if rows else None

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        rows = self._run(
            "SELECT tinker_path, kind, name, size_bytes, created FROM checkpoints WHERE model_id = ? ORDER BY created",
            (model_id,),
        )
        return [dict(zip(("tinker_path", "kind", "name", "size_bytes", "created"), r, strict=True)) for r in rows]

    def delete_checkpoint(self, tinker_path: str) -> None:
        self._run("DELETE FROM checkpoints WHERE tinker_path = ?", (tinker_path,))

    # sessions
    def add_session(self, session_id: str) -> None:
        now = time.time()
        self._run("INSERT OR IGNORE INTO sessions VALUES (?, ?, ?)", (session_id, now, now))

    def heartbeat(self, session_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("UPDATE sessions SET heartbeat = ? WHERE session_id = ?", (time.time(), session_id))
            return cur.rowcount > 0

    def add_sampling_session(self, sid: str, idem_key: str, model_path: str | None, base_model: str) -> str:
        """The sampling session id for `idem_key` (a retried create returns the first one)."""
        rows = self._run("SELECT sampling_session_id FROM sampling_sessions WHERE idem_key = ?", (idem_key,))
        if rows:
            return rows[0][0]
        self._run("INSERT INTO sampling_sessions VALUES (?, ?, ?, ?)", (sid, idem_key, model_path, base_model))
        return sid

    def sampling_session(self, sid: str) -> tuple[str | None, str] | None:
        rows = self._run("SELECT model_path, base_model FROM sampling_sessions WHERE sampling_session_id = ?", (sid,))
        return (rows[0][0], rows[0][1]) if rows else None

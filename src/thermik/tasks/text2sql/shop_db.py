"""The shop database behind the `sql` server and the `text2sql` environment.

A small, realistic SQLite database (customers, products, orders, order items) generated
deterministically from a fixed seed and built on first use into the cache directory
(file name carries a hash of the generator version, so a changed generator builds a new
file). Opened read-only (`mode=ro` URI) with an authorizer that allows reads only and a
progress handler that stops long queries.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermik.tools.mcp_launch import cache_dir

DB_VERSION = "shop-v1"
SCHEMA = """
CREATE TABLE customers (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, country TEXT NOT NULL, signup_year INTEGER NOT NULL
);
CREATE TABLE products (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL
);
CREATE TABLE orders (
  id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), order_year INTEGER NOT NULL,
  status TEXT NOT NULL
);
CREATE TABLE order_items (
  order_id INTEGER NOT NULL REFERENCES orders(id), product_id INTEGER NOT NULL REFERENCES products(id),
  quantity INTEGER NOT NULL
);
"""
CITIES: dict[str, str] = {
    "Lisbon": "Portugal", "Porto": "Portugal", "Madrid": "Spain", "Seville": "Spain", "Lyon": "France",
    "Paris": "France", "Munich": "Germany", "Hamburg": "Germany", "Turin": "Italy", "Naples": "Italy",
}  # fmt: skip
FIRST_NAMES = ("Ana", "Ben", "Chloe", "David", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Karla", "Luca")
LAST_NAMES = ("Silva", "Moreau", "Rossi", "Keller", "Garcia", "Novak", "Berg", "Costa", "Lang", "Duarte")
PRODUCTS: dict[str, tuple[str, ...]] = {
    "books": ("Atlas", "Cookbook", "Novel", "Poetry", "Dictionary"),
    "garden": ("Shovel", "Hose", "Rake", "Planter", "Seeds"),
    "kitchen": ("Kettle", "Pan", "Knife", "Teapot", "Blender"),
    "toys": ("Kite", "Puzzle", "Yo-yo", "Robot", "Train set"),
}
STATUSES = ("shipped", "delivered", "cancelled", "pending")
YEARS = (2021, 2022, 2023, 2024)
QUERY_TIMEOUT_S = 2.0
_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)


class SQLError(ValueError):
    """A query was refused or failed; the message is shown to the model."""


def generate(conn: sqlite3.Connection, seed: str = DB_VERSION) -> None:
    """Create the schema and fill it deterministically from `seed`."""
    rng = random.Random(seed)
    conn.executescript(SCHEMA)
    customers = []
    for cid in range(1, 61):
        city = rng.choice(sorted(CITIES))
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        customers.append((cid, name, city, CITIES[city], rng.choice(YEARS[:3])))
    conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?)", customers)
    products, pid = [], 0
    for category, names in PRODUCTS.items():
        for name in names:
            pid += 1
            products.append((pid, name, category, round(rng.uniform(3, 120), 2)))
    conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products)
    orders, items = [], []
    for oid in range(1, 301):
        orders.append((oid, rng.randint(1, len(customers)), rng.choice(YEARS), rng.choice(STATUSES)))
        for product_id in rng.sample(range(1, pid + 1), rng.randint(1, 3)):
            items.append((oid, product_id, rng.randint(1, 5)))
    conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)
    conn.executemany("INSERT INTO order_items VALUES (?, ?, ?)", items)
    conn.commit()


def database_path(directory: str | Path | None = None) -> Path:
    """The built database file, building it atomically (temp file, then rename) when absent."""
    path = Path(directory or cache_dir()) / f"{DB_VERSION}.sqlite"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{DB_VERSION}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as conn:
            generate(conn)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool
    """More rows existed than the cap allowed."""

    def format(self) -> str:
        """The text the model sees: a header, one line per row (values joined by ' | '), a row count."""
        lines = [" | ".join(self.columns)] + [" | ".join(_cell(v) for v in row) for row in self.rows]
        more = f"first {len(self.rows)} rows shown; more were cut" if self.truncated else f"{len(self.rows)} rows"
        return "\n".join([*lines, f"({more})"])


class ReadOnlyDatabase:
    """A read-only connection: `mode=ro` URI, an authorizer allowing reads only, and a per-query time limit."""

    def __init__(self, path: str | Path, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SQLite database not found: {path}")
        self.path = path
        self.timeout_s = timeout_s
        self._deadline = 0.0
        self._lock = threading.Lock()  # one query at a time: the deadline belongs to the running query
        self._conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._conn.set_authorizer(_authorize)
        self._conn.set_progress_handler(lambda: int(time.monotonic() > self._deadline), 10_000)

    def query(self, sql: str, max_rows: int) -> QueryResult:
        """Run one SELECT; raise SQLError with a readable message when it is refused, fails or runs too long."""
        if not isinstance(sql, str) or not sql.strip():
            raise SQLError("empty SQL query")
        with self._lock:
            self._deadline = time.monotonic() + self.timeout_s
            try:
                cursor = self._conn.execute(sql)
                rows = cursor.fetchmany(max_rows + 1)
            except (sqlite3.Error, sqlite3.Warning) as exc:
                raise SQLError(_explain(exc, self.timeout_s)) from None
        columns = tuple(d[0] for d in cursor.description or ())
        return QueryResult(columns, tuple(rows[:max_rows]), truncated=len(rows) > max_rows)

    def tables(self) -> list[str]:
        rows = self.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", 1000).rows
        return [r[0] for r in rows]

    def describe(self, table: str) -> str:
        """The table's CREATE statement; an unknown table names the valid ones."""
        row = self.query(f"SELECT sql FROM sqlite_master WHERE type = 'table' AND name = {_quote(table)}", 1).rows
        if not row:
            raise SQLError(f"unknown table {table!r}; tables: {', '.join(self.tables())}")
        return " ".join(row[0][0].split())

    def close(self) -> None:
        self._conn.close()


def _explain(exc: BaseException, timeout_s: float) -> str:
    if "interrupted" in str(exc):
        return f"query took longer than {timeout_s:g}s and was stopped"
    if "not authorized" in str(exc):
        return "only read-only SELECT queries are allowed"
    return f"SQL error: {exc}"


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _quote(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return str(round(value, 4))
    return "NULL" if value is None else str(value)

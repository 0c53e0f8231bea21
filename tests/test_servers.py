"""thermik's own MCP servers over real stdio (sql, search, python_sandbox), and the sandbox's limits."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from thermik.tasks.code import server as python_sandbox
from thermik.tasks.code.sandbox_runner import SandboxLimits, network_namespace_available, run_python
from thermik.tasks.search import server as search
from thermik.tasks.search.corpus import build, default_index
from thermik.tasks.text2sql import server as sql
from thermik.tasks.text2sql.shop_db import DB_VERSION, ReadOnlyDatabase, SQLError, database_path
from thermik.tools.mcp_pool import MCPPool

LIMITS = SandboxLimits(wall_s=5, cpu_s=2, memory_mb=256)


@pytest.fixture(scope="module")
def shop_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return database_path(tmp_path_factory.mktemp("cache"))


async def _calls(spec, calls):
    pool = MCPPool()
    try:
        return [await pool.call_tool(spec, name, args, 20.0) for name, args in calls]
    finally:
        await pool.aclose()


# ---------------------------------------------------------------- sql


def test_shop_database_is_deterministic_and_built_atomically(tmp_path, shop_db):
    again = database_path(tmp_path)
    assert again.name == f"{DB_VERSION}.sqlite" and sorted(p.name for p in tmp_path.iterdir()) == [again.name]
    dump = lambda path: list(sqlite3.connect(path).iterdump())  # noqa: E731
    assert dump(again) == dump(shop_db)


def test_sql_server_lists_describes_queries_and_refuses_writes(shop_db):
    spec = sql.server_spec(shop_db, max_rows=5)
    results = asyncio.run(
        _calls(spec, [
            ("list_tables", {}),
            ("describe_table", {"table": "orders"}),
            ("query", {"sql": "SELECT id, status FROM orders ORDER BY id"}),
            ("query", {"sql": "SELECT COUNT(*) FROM orders"}),
            ("query", {"sql": "DROP TABLE orders"}),
            ("query", {"sql": "ATTACH DATABASE '/tmp/x.db' AS x"}),
            ("describe_table", {"table": "nope"}),
        ])
    )  # fmt: skip
    assert results[0].text.split("\n") == ["customers", "order_items", "orders", "products"]
    assert results[1].text.startswith("CREATE TABLE orders (") and "order_year INTEGER" in results[1].text
    lines = results[2].text.split("\n")
    assert lines[0] == "id | status" and len(lines) == 7 and lines[-1] == "(first 5 rows shown; more were cut)"
    assert results[3].text == "COUNT(*)\n300\n(1 rows)"
    for refused in results[4:6]:
        assert refused.is_error and "only read-only SELECT queries are allowed" in refused.text
    assert results[6].is_error and "unknown table 'nope'; tables: customers" in results[6].text
    assert ReadOnlyDatabase(shop_db).query("SELECT COUNT(*) FROM orders", 1).rows == ((300,),)  # still intact


def test_sql_query_time_limit(shop_db):
    database = ReadOnlyDatabase(shop_db, timeout_s=0.2)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    with pytest.raises(SQLError, match=r"longer than 0\.2s"):
        database.query(endless, 1)
    assert database.query("SELECT 1", 1).rows == ((1,),)  # the connection still works


def test_read_only_even_without_the_authorizer(shop_db):
    conn = sqlite3.connect(f"{shop_db.resolve().as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM orders")


# ---------------------------------------------------------------- search


def test_corpus_is_deterministic_and_answers_are_in_their_documents():
    docs, facts = build()
    assert len(docs) == 300 and len({d.title for d in docs}) == 300
    by_id = {d.doc_id: d for d in docs}
    assert all(f.answer in by_id[f.doc_id].text for f in facts)
    assert docs[0].title == "Faithbrai"  # a changed generator is a deliberate change (bump CORPUS_VERSION)


def test_bm25_ranks_the_named_entity_first():
    doc = build()[0][242]  # a person: their name is in no other document
    assert default_index().search(f"tell me about {doc.title}", 3)[0] == doc
    assert default_index().search("the of and", 3) == []  # stop words only: nothing, not an error


def test_search_server_search_and_open():
    doc = build()[0][207]
    results = asyncio.run(
        _calls(search.server_spec(), [
            ("search", {"query": doc.title, "k": 2}),
            ("open", {"doc_id": "207"}),
            ("open", {"doc_id": "100000"}),
            ("search", {"query": "x", "k": 0}),
        ])
    )  # fmt: skip
    assert results[0].text.split("\n")[0] == f"[207] {doc.text}"
    assert results[1].text == doc.text
    assert results[2].is_error and "unknown doc_id" in results[2].text
    assert results[3].is_error and "k must be between 1 and 10" in results[3].text


# ---------------------------------------------------------------- python sandbox


def test_sandbox_runs_code_and_reports_output_and_exit_status():
    ok = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise SystemExit(3)", LIMITS)
    assert (ok.stdout, ok.stderr, ok.exit_code, ok.timed_out) == ("out\n", "err\n", 3, False)


def test_sandbox_refuses_network():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bool] = []
    thread = threading.Thread(target=lambda: accepted.append(bool(server.accept())), daemon=True)
    thread.start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_python(code, LIMITS)
    server.close()
    assert result.exit_code == 1 and "connected" not in result.stdout
    assert "PermissionError: sandbox: socket" in result.stderr
    assert not accepted


@pytest.mark.skipif(not network_namespace_available(), reason="no unprivileged network namespaces here")
def test_sandbox_network_namespace_has_no_interfaces_up():
    result = run_python("print(open('/proc/net/dev').read())", LIMITS)
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if line.strip()]
    assert interfaces == ["lo"]


def test_sandbox_refuses_writes_outside_its_directory(tmp_path):
    target = tmp_path / "escape.txt"
    outside = [
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        "import os\nos.symlink('/etc', 'etc')\nopen('etc/thermik-escape', 'w')",
        f"import os\nos.mkdir({str(tmp_path / 'd')!r})",
        f"import sqlite3\nsqlite3.connect({str(target)!r})",
        "open('../escape.txt', 'w').write('x')",
    ]
    for code in outside:
        result = run_python(code, LIMITS)
        assert result.exit_code == 1 and "PermissionError: sandbox:" in result.stderr, code
    assert list(tmp_path.iterdir()) == []
    inside = run_python(
        "open('a.txt', 'w').write('hi')\nimport os\nos.mkdir('d')\nprint(sorted(os.listdir('.')))", LIMITS
    )
    assert inside.exit_code == 0 and inside.stdout == "['a.txt', 'd', 'main.py']\n"


def test_sandbox_refuses_a_fork_bomb_subprocesses_and_raising_its_limits():
    for code in [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import ctypes\nctypes.CDLL(None).fork()",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
    ]:
        result = run_python(code, LIMITS)
        assert result.exit_code == 1 and "PermissionError: sandbox:" in result.stderr, code


def test_sandbox_cpu_memory_wall_clock_and_output_limits():
    cpu = run_python("while True:\n    pass", SandboxLimits(wall_s=60, cpu_s=1))
    assert cpu.exit_code < 0 and not cpu.timed_out  # SIGXCPU / SIGKILL from RLIMIT_CPU
    memory = run_python("x = bytearray(1024 ** 3)", LIMITS)
    assert memory.exit_code == 1 and "MemoryError" in memory.stderr
    wall = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.5))
    assert wall.timed_out and wall.exit_code == -9
    big = run_python("print('x' * 10_000_000)", LIMITS)
    assert len(big.stdout) < LIMITS.max_output_chars + 100 and "output cut" in big.stdout
    binary = run_python("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok')", LIMITS)
    assert binary.exit_code == 0 and binary.stdout.endswith(" ok")


def test_sandbox_leaves_no_process_or_directory_behind():
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.3))
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_python_sandbox_server_over_stdio():
    results = asyncio.run(
        _calls(python_sandbox.server_spec(LIMITS), [
            ("run_python", {"code": "print(6 * 7)"}),
            ("run_python", {"code": "import time\ntime.sleep(5)", "timeout_s": 0.3}),
            ("run_python", {"code": "print(1)", "timeout_s": 60}),
        ])
    )  # fmt: skip
    assert results[0].text == "exit code 0\n--- stdout\n42\n\n--- stderr\n"
    assert "wall-clock limit reached" in results[1].text
    assert results[2].is_error and "timeout_s must be in (0, 5]" in results[2].text


@pytest.mark.parametrize("module", ["text2sql.server", "search.server", "code.server", "calculator.server"])
def test_server_modules_answer_help(module):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", f"thermik.tasks.{module}", "--help"], capture_output=True,
                         text=True, timeout=60, env={**os.environ})  # fmt: skip
    assert out.returncode == 0 and "usage:" in out.stdout

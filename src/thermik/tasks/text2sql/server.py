"""Read-only SQL MCP server (stdio) over the shipped shop database (see shop_db).

Run: `python -m thermik.tasks.text2sql.server [--db PATH] [--max-rows N] [--timeout S]`. Without --db it
builds (once) and serves the shop database from the cache directory. Tools: list_tables,
describe_table(table), query(sql) — SELECT only, at most --max-rows rows, at most --timeout seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from thermik.tasks.text2sql.shop_db import QUERY_TIMEOUT_S, ReadOnlyDatabase, SQLError, database_path
from thermik.tools.mcp_launch import module_server_spec
from thermik.tools.mcp_pool import ServerSpec

DEFAULT_MAX_ROWS = 20
TOOL_NAMES = ("list_tables", "describe_table", "query")


def server_spec(db: str | Path, max_rows: int = DEFAULT_MAX_ROWS) -> ServerSpec:
    return module_server_spec("thermik.tasks.text2sql.server", "--db", str(db), "--max-rows", str(max_rows))


def build_server(db: str | Path, max_rows: int = DEFAULT_MAX_ROWS, timeout_s: float = QUERY_TIMEOUT_S) -> MCPServer:
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    database = ReadOnlyDatabase(db, timeout_s=timeout_s)
    app: MCPServer = MCPServer(name="thermik-sql")

    @app.tool(name="list_tables", description="List the tables of the database.")
    def list_tables() -> str:
        return "\n".join(database.tables())

    @app.tool(name="describe_table", description="Show the CREATE TABLE statement of one table.")
    def describe_table(table: str) -> str:
        try:
            return database.describe(table)
        except SQLError as exc:
            raise ToolError(str(exc)) from None

    @app.tool(name="query", description=f"Run one read-only SQL SELECT; at most {max_rows} rows are returned.")
    def query(sql: str) -> str:
        try:
            return database.query(sql, max_rows).format()
        except SQLError as exc:
            raise ToolError(str(exc)) from None

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=None, help="SQLite file (default: the shop database).")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="Rows returned per query.")
    parser.add_argument("--timeout", type=float, default=QUERY_TIMEOUT_S, help="Seconds a query may run.")
    args = parser.parse_args(argv)
    if args.max_rows < 1 or args.timeout <= 0:
        parser.error("--max-rows must be >= 1 and --timeout > 0")
    db = args.db if args.db is not None else database_path()
    if not db.is_file():
        parser.error(f"--db {db}: no such file")
    build_server(db, args.max_rows, args.timeout).run()


if __name__ == "__main__":
    main()

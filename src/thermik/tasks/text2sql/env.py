"""Text-to-SQL over the shop database, with the `sql` MCP server's tools.

The model may call list_tables / describe_table / query, and ends with either `<sql>SELECT ...</sql>` or
`<answer>value</answer>`. Reward (execution match): 1.0 when the final SQL's result equals the gold
SQL's result on the database — as a multiset of rows, or as a list when the gold SQL has ORDER BY;
numbers compare after rounding to 4 decimals. An `<answer>` earns 1.0 when the gold result is one cell
and the answer matches it (numbers numerically, text after SQuAD normalisation). Anything else: 0.

reward_spec: {"ground_truth": "<gold SQL>"}; extra_info may name another SQLite file as "db".
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.answers import normalize_answer, numbers_match, tagged_answer, to_number
from thermik.envs.base import Env, StepOutput
from thermik.envs.tool_use import ServerTools, function_schema
from thermik.tasks.text2sql import server as sql_server
from thermik.tasks.text2sql.shop_db import QueryResult, ReadOnlyDatabase, SQLError, database_path
from thermik.tools.mcp_pool import MCPPool

SQL_TOOLS: list[dict[str, Any]] = [
    function_schema("list_tables", "List the tables of the database.", {}, []),
    function_schema("describe_table", "Show one table's columns.", {"table": {"type": "string"}}, ["table"]),
    function_schema("query", "Run one read-only SELECT.", {"sql": {"type": "string"}}, ["sql"]),
]
GRADING_MAX_ROWS = 100_000
_SQL_TAG = re.compile(r"<sql>(.*?)</sql>", re.DOTALL)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


@functools.cache
def _database(path: str) -> ReadOnlyDatabase:
    return ReadOnlyDatabase(path)


def run_sql(db: str | Path, sql: str) -> QueryResult:
    return _database(str(db)).query(sql, GRADING_MAX_ROWS)


def _cell(value: Any) -> Any:
    number = to_number(value) if isinstance(value, int | float) else None
    return round(number, 4) if number is not None else value


def results_match(predicted: QueryResult, gold: QueryResult, ordered: bool) -> bool:
    pred_rows = [tuple(_cell(v) for v in row) for row in predicted.rows]
    gold_rows = [tuple(_cell(v) for v in row) for row in gold.rows]
    return pred_rows == gold_rows if ordered else Counter(pred_rows) == Counter(gold_rows)


def answer_matches(answer: str, gold: QueryResult) -> bool:
    if len(gold.rows) != 1 or len(gold.rows[0]) != 1:
        return False
    value = gold.rows[0][0]
    if isinstance(value, int | float):
        return numbers_match(answer.strip(), value)
    return normalize_answer(answer) == normalize_answer(str(value))


class Text2SQLEnv(Env):
    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        gold = reward_spec.get("ground_truth")
        if not isinstance(gold, str) or not gold.strip():
            raise ValueError(f"text2sql: reward_spec['ground_truth'] must be the gold SQL string, got {gold!r}")
        self.db = Path(extra_info.get("db") or database_path())
        try:
            self.gold = run_sql(self.db, gold)
        except SQLError as exc:
            raise ValueError(f"text2sql: the gold SQL fails on {self.db}: {exc}") from None
        self.ordered = bool(_ORDER_BY.search(gold))
        self.tools = SQL_TOOLS
        self.server = ServerTools(sql_server.server_spec(self.db), SQL_TOOLS, options, pool)

    def step(self, action: str) -> StepOutput:
        raise TypeError("Text2SQLEnv calls an MCP server asynchronously: use `await env.astep(action)`")

    async def astep(self, action: str) -> StepOutput:
        final = self._grade(action)
        if final is not None:
            return final
        turn = await self.server.run_turn(action)
        return StepOutput(turn.observations, 0.0, not turn.found, turn.metrics())

    def _grade(self, action: str) -> StepOutput | None:
        """The final step's output when the action gives `<sql>` or `<answer>`; None otherwise."""
        sql = _SQL_TAG.findall(action)
        if sql:
            try:
                correct = results_match(run_sql(self.db, sql[-1]), self.gold, self.ordered)
                error = ""
            except SQLError as exc:
                correct, error = False, str(exc)
            return StepOutput([], float(correct), True, {"execution_match": correct, "sql_error": bool(error)})
        answer = tagged_answer(action)
        if answer is not None:
            correct = answer_matches(answer, self.gold)
            return StepOutput([], float(correct), True, {"answer_match": correct})
        return None

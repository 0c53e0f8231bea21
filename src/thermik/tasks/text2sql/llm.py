"""LLM-written text2sql rows: the request, the rule-generated examples, and the check every reply must pass.

The SQL must run on the shop database and return rows.
"""

from __future__ import annotations

import random
from typing import Any

from thermik.data.llm_generate import LLMTask, Rejected
from thermik.tasks.text2sql.generate import question_sql_row, sql_problem, sql_row
from thermik.tasks.text2sql.shop_db import ReadOnlyDatabase, SQLError, database_path


def _sql_example(rng: random.Random) -> dict[str, Any]:
    row = sql_row(sql_problem(rng))
    return {"question": row["prompt"][-1]["content"], "sql": row["reward_spec"]["ground_truth"]}


def _sql_to_row(obj: dict[str, Any]) -> dict[str, Any]:
    question, sql = obj.get("question"), obj.get("sql")
    if not isinstance(question, str) or not question.strip() or not isinstance(sql, str):
        raise Rejected("needs string fields question and sql")
    database = ReadOnlyDatabase(database_path())
    try:
        if not database.query(sql, 1).rows:
            raise Rejected("sql returns no rows")
    except SQLError as exc:
        raise Rejected(f"sql fails: {exc}") from None
    finally:
        database.close()
    return question_sql_row(question.strip(), sql.strip(), {"source": "llm"})


SQL_LLM_TASK = LLMTask(
    "Write a question about the shop database (customers(id, name, city, country, signup_year), products(id, "
    "name, category, price), orders(id, customer_id, order_year, status), order_items(order_id, product_id, "
    'quantity)) and the SQLite query answering it. JSON keys: "question", "sql".',
    _sql_example,
    _sql_to_row,
)

"""Text-to-SQL questions over the shop database, each with its gold SQL, from templates.

The solver runs the gold SQL through the `query` tool (the observation is exactly what the sql server
returns) and then states it as the final `<sql>` answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from thermik.data.problem_key import make_key, read_key
from thermik.envs.base import Message
from thermik.tasks.text2sql.server import DEFAULT_MAX_ROWS
from thermik.tasks.text2sql.shop_db import CITIES, PRODUCTS, STATUSES, YEARS, ReadOnlyDatabase, database_path
from thermik.tools.parsers import format_hermes_tool_call

SQL_SYSTEM = (
    "Answer the question with one SQLite query over the shop database (tables customers, products, orders, "
    "order_items). You may run queries with the query tool. End with the final query between sql tags."
)
_PRODUCT_NAMES = tuple(name for names in PRODUCTS.values() for name in names)
_COUNTRIES = tuple(sorted(set(CITIES.values())))

Task = tuple[str, str]
"""(question, gold SQL)."""

TEMPLATES: dict[str, tuple[Callable[[random.Random], dict[str, Any]], Callable[[dict[str, Any]], Task]]] = {
    "customers_in_city": (
        lambda r: {"city": r.choice(sorted(CITIES))},
        lambda v: (f"How many customers live in {v['city']}?",
                   f"SELECT COUNT(*) FROM customers WHERE city = '{v['city']}'"),
    ),
    "customers_city_year": (
        lambda r: {"city": r.choice(sorted(CITIES)), "year": r.choice(YEARS[:3])},
        lambda v: (f"How many customers from {v['city']} signed up in {v['year']}?",
                   f"SELECT COUNT(*) FROM customers WHERE city = '{v['city']}' AND signup_year = {v['year']}"),
    ),
    "orders_in_year_status": (
        lambda r: {"year": r.choice(YEARS), "status": r.choice(STATUSES)},
        lambda v: (f"How many orders from {v['year']} have status {v['status']}?",
                   f"SELECT COUNT(*) FROM orders WHERE order_year = {v['year']} AND status = '{v['status']}'"),
    ),
    "products_in_category": (
        lambda r: {"category": r.choice(sorted(PRODUCTS))},
        lambda v: (f"List the names of the products in the {v['category']} category.",
                   f"SELECT name FROM products WHERE category = '{v['category']}'"),
    ),
    "product_price": (
        lambda r: {"product": r.choice(_PRODUCT_NAMES)},
        lambda v: (f"What is the price of the {v['product']}?",
                   f"SELECT price FROM products WHERE name = '{v['product']}'"),
    ),
    "products_over_price": (
        lambda r: {"price": r.randrange(10, 115, 5)},
        lambda v: (f"Which products cost more than {v['price']} dollars?",
                   f"SELECT name FROM products WHERE price > {v['price']}"),
    ),
    "orders_country_year": (
        lambda r: {"country": r.choice(_COUNTRIES), "year": r.choice(YEARS)},
        lambda v: (f"How many orders did customers from {v['country']} place in {v['year']}?",
                   "SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id "
                   f"WHERE customers.country = '{v['country']}' AND orders.order_year = {v['year']}"),
    ),
    "quantity_sold": (
        lambda r: {"product": r.choice(_PRODUCT_NAMES)},
        lambda v: (f"How many units of the {v['product']} were ordered in total?",
                   "SELECT SUM(quantity) FROM order_items JOIN products ON order_items.product_id = products.id "
                   f"WHERE products.name = '{v['product']}'"),
    ),
    "orders_of_customer": (
        lambda r: {"customer": r.randint(1, 60)},
        lambda v: (f"How many orders did the customer with id {v['customer']} place?",
                   f"SELECT COUNT(*) FROM orders WHERE customer_id = {v['customer']}"),
    ),
}  # fmt: skip
"""template name -> (draw the values, (question, gold SQL))."""


def sql_problem(rng: random.Random) -> str:
    template = rng.choice(sorted(TEMPLATES))
    return make_key(template, **TEMPLATES[template][0](rng))


def sql_task(key: str) -> Task:
    template, values = read_key(key)
    return TEMPLATES[template][1](values)


def sql_row(key: str) -> dict[str, Any]:
    question, gold = sql_task(key)
    return question_sql_row(question, gold, {"problem": key})


def question_sql_row(question: str, gold: str, extra_info: dict[str, Any]) -> dict[str, Any]:
    return {
        "data_source": "synthetic/text2sql",
        "env_class": "text2sql",
        "prompt": [{"role": "system", "content": SQL_SYSTEM}, {"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": gold},
        "extra_info": extra_info,
    }


def sql_solve(row: dict[str, Any]) -> list[Message]:
    gold = row["reward_spec"]["ground_truth"]
    database = ReadOnlyDatabase(row["extra_info"].get("db") or database_path())
    try:
        result = database.query(gold, DEFAULT_MAX_ROWS).format()
    finally:
        database.close()
    return [
        *row["prompt"],
        {"role": "assistant", "content": format_hermes_tool_call("query", {"sql": gold})},
        {"role": "tool", "name": "query", "content": result},
        {"role": "assistant", "content": f"<sql>{gold}</sql>"},
    ]

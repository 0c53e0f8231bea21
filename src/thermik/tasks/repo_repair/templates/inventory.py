"""Template family `inventory` (training rows): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _restock(r: random.Random) -> Unit:
    minimum = r.randint(3, 8)
    return unit(
        "restock",
        f"""
def restock(stock, minimum={minimum}):
    orders = {{}}
    for item, count in sorted(stock.items()):
        if count < minimum:
            orders[item] = minimum - count
    return orders
""",
        f"ordering items whose stock is below {minimum}",
        f"restock({{'apple': 1, 'pear': {minimum}, 'fig': {minimum + 4}}})", "restock({})",
        "restock({'nut': 0})",
    )  # fmt: skip


def _total_value(r: random.Random) -> Unit:
    return unit(
        "total_value",
        """
def total_value(stock, prices):
    total = 0
    for item, count in stock.items():
        total += count * prices.get(item, 0)
    return total
""",
        "the total value of a stock at given prices",
        "total_value({'a': 2, 'b': 3}, {'a': 5, 'b': 7})", "total_value({}, {})", "total_value({'c': 4}, {})",
    )  # fmt: skip


def _apply_discount(r: random.Random) -> Unit:
    percent = r.choice([10, 15, 20, 25])
    return unit(
        "apply_discount",
        f"""
def apply_discount(price, quantity, percent={percent}, threshold=10):
    total = price * quantity
    if quantity >= threshold:
        total = total - total * percent / 100
    return round(total, 2)
""",
        f"the price of an order with a {percent}% discount from 10 items on",
        "apply_discount(2.5, 4)", "apply_discount(3, 10)", "apply_discount(1, 12)", "apply_discount(4, 9)",
    )  # fmt: skip


def _remove_items(r: random.Random) -> Unit:
    return unit(
        "remove_items",
        """
def remove_items(stock, item, count):
    have = stock.get(item, 0)
    if count > have:
        raise ValueError('not enough ' + item)
    left = dict(stock)
    left[item] = have - count
    return left
""",
        "taking items out of a stock",
        "remove_items({'a': 5}, 'a', 2)", "remove_items({'a': 5, 'b': 1}, 'b', 1)", "remove_items({'a': 3}, 'a', 3)",
    )  # fmt: skip


def _top_items(r: random.Random) -> Unit:
    k = r.randint(2, 3)
    return unit(
        "top_items",
        f"""
def top_items(stock, k={k}):
    ranked = sorted(stock.items(), key=lambda pair: (-pair[1], pair[0]))
    return [name for name, _ in ranked[:k]]
""",
        f"the {k} items with the largest stock",
        "top_items({'a': 1, 'b': 5, 'c': 3, 'd': 5})", "top_items({})", "top_items({'x': 2, 'y': 9, 'z': 4, 'w': 0})",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "stock": (_restock, _remove_items, _top_items),
    "pricing": (_total_value, _apply_discount),
}
"""module name -> the units it holds (drawn per package)."""

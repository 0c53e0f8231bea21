"""Template family `bank` (held-out rows only): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _compound(r: random.Random) -> Unit:
    rate = r.choice([2, 3, 5])
    return unit(
        "compound",
        f"""
def compound(balance, years, rate={rate}):
    for _ in range(years):
        balance = balance + balance * rate / 100
    return round(balance, 2)
""",
        f"a balance after yearly interest of {rate}%",
        "compound(100, 0)", "compound(100, 1)", "compound(1000, 3)",
    )  # fmt: skip


def _withdraw(r: random.Random) -> Unit:
    fee = r.choice([1, 2])
    return unit(
        "withdraw",
        f"""
def withdraw(balance, amount, fee={fee}):
    if amount <= 0:
        raise ValueError('amount must be positive')
    if amount + fee > balance:
        return balance
    return balance - amount - fee
""",
        f"withdrawing money with a fee of {fee}",
        "withdraw(100, 10)", f"withdraw(10, {10 - fee})", "withdraw(5, 10)", f"withdraw(20, {20 - fee + 1})",
    )  # fmt: skip


def _statement(r: random.Random) -> Unit:
    return unit(
        "statement",
        """
def statement(transactions):
    balance = 0
    lines = []
    for amount in transactions:
        balance += amount
        lines.append(balance)
    return lines
""",
        "the running balances of an account",
        "statement([10, -5, 20])", "statement([])", "statement([-3])",
    )  # fmt: skip


def _largest_debit(r: random.Random) -> Unit:
    return unit(
        "largest_debit",
        """
def largest_debit(transactions):
    largest = 0
    for amount in transactions:
        if amount < 0 and -amount > largest:
            largest = -amount
    return largest
""",
        "the largest single debit of an account",
        "largest_debit([10, -5, -20, 3])", "largest_debit([])", "largest_debit([4, 5])",
    )  # fmt: skip


def _monthly_totals(r: random.Random) -> Unit:
    return unit(
        "monthly_totals",
        """
def monthly_totals(entries):
    totals = {}
    for month, amount in entries:
        totals[month] = totals.get(month, 0) + amount
    return totals
""",
        "the total amount per month",
        "monthly_totals([(1, 5), (2, 3), (1, -2)])", "monthly_totals([])", "monthly_totals([(12, 7)])",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "accounts": (_withdraw, _statement, _largest_debit),
    "interest": (_compound, _monthly_totals),
}
"""module name -> the units it holds (drawn per package)."""

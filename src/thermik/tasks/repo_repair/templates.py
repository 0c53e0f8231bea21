"""The template families repo-repair packages are built from.

A family is a set of modules; a module is a list of units; a unit is one function (its source, with constants
drawn per package), a one-line description of what it computes (for problem statements that do not name the
function) and the calls its tests make. Expected values come from running the unit's correct source here
(trusted: our own code), so tests and reference always agree. Families in `HELD_OUT_FAMILIES` are never used
for training rows: held-out tasks come from families the policy never saw.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    name: str
    source: str
    description: str
    calls: tuple[str, ...]
    """Python expressions calling the function (the module's other names are in scope)."""


Draw = Callable[[random.Random], Unit]


def _unit(name: str, source: str, description: str, *calls: str) -> Unit:
    return Unit(name, source.strip() + "\n", description, calls)


# ------------------------------------------------------------------ family: stats (train)


def _mean(r: random.Random) -> Unit:
    return _unit(
        "mean",
        """
def mean(values):
    if not values:
        return 0.0
    total = 0
    for value in values:
        total = total + value
    return total / len(values)
""",
        "the average of a list of numbers",
        "mean([1, 2, 3, 4])", "mean([])", "mean([10])", "mean([-3, 3, 9])",
    )  # fmt: skip


def _clamp(r: random.Random) -> Unit:
    lo, hi = r.randint(-10, 0), r.randint(5, 20)
    return _unit(
        "clamp",
        f"""
def clamp(value, low={lo}, high={hi}):
    if value < low:
        return low
    if value > high:
        return high
    return value
""",
        f"clamping a number into the range [{lo}, {hi}]",
        f"clamp({lo - 5})", f"clamp({hi + 3})", f"clamp({(lo + hi) // 2})", f"clamp({hi})", f"clamp({lo})",
    )  # fmt: skip


def _running_max(r: random.Random) -> Unit:
    return _unit(
        "running_max",
        """
def running_max(values):
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
""",
        "the running maximum of a sequence",
        "running_max([3, 1, 4, 1, 5])", "running_max([])", "running_max([2, 2, 1])",
    )  # fmt: skip


def _variance(r: random.Random) -> Unit:
    return _unit(
        "variance",
        """
def variance(values):
    n = len(values)
    if n < 2:
        return 0.0
    center = sum(values) / n
    return sum(((v - center) ** 2 for v in values)) / (n - 1)
""",
        "the sample variance of a list of numbers",
        "variance([1, 2, 3, 4])", "variance([5])", "variance([2, 4, 4, 4, 5, 5, 7, 9])",
    )  # fmt: skip


def _histogram(r: random.Random) -> Unit:
    width = r.choice([2, 5, 10])
    return _unit(
        "histogram",
        f"""
def histogram(values, width={width}):
    counts = {{}}
    for value in values:
        bucket = value // width * width
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts
""",
        f"counting numbers into buckets of width {width}",
        f"histogram([0, 1, {width}, {width + 1}, {3 * width}])", "histogram([])", f"histogram([{width - 1}])",
    )  # fmt: skip


def _median(r: random.Random) -> Unit:
    return _unit(
        "median",
        """
def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    middle = n // 2
    if n % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
""",
        "the median of a list of numbers",
        "median([3, 1, 2])", "median([4, 1, 3, 2])", "median([])", "median([7])",
    )  # fmt: skip


# ------------------------------------------------------------------ family: text (train)


def _slugify(r: random.Random) -> Unit:
    sep = r.choice(["-", "_"])
    return _unit(
        "slugify",
        f"""
def slugify(text):
    words = []
    for word in text.lower().split():
        cleaned = ''.join((c for c in word if c.isalnum()))
        if cleaned:
            words.append(cleaned)
    return '{sep}'.join(words)
""",
        "turning a title into a URL slug",
        "slugify('Hello World')", "slugify('  A, B!  c ')", "slugify('')", "slugify('Rust & Go 2024')",
    )  # fmt: skip


def _truncate(r: random.Random) -> Unit:
    limit = r.randint(6, 12)
    return _unit(
        "truncate",
        f"""
def truncate(text, limit={limit}):
    if len(text) <= limit:
        return text
    return text[:limit - 3] + '...'
""",
        f"shortening a text to at most {limit} characters with an ellipsis",
        "truncate('short')", "truncate('a rather long sentence here')", f"truncate('{'x' * limit}')",
        f"truncate('{'y' * (limit + 1)}')",
    )  # fmt: skip


def _count_vowels(r: random.Random) -> Unit:
    return _unit(
        "count_vowels",
        """
def count_vowels(text):
    count = 0
    for char in text.lower():
        if char in 'aeiou':
            count += 1
    return count
""",
        "counting the vowels in a text",
        "count_vowels('Hello')", "count_vowels('xyz')", "count_vowels('AEIOU aeiou')",
    )  # fmt: skip


def _capitalize_words(r: random.Random) -> Unit:
    return _unit(
        "capitalize_words",
        """
def capitalize_words(text):
    parts = text.split(' ')
    return ' '.join((p[:1].upper() + p[1:] for p in parts))
""",
        "capitalising every word of a text",
        "capitalize_words('hello big world')", "capitalize_words('')", "capitalize_words('a')",
    )  # fmt: skip


def _is_palindrome(r: random.Random) -> Unit:
    return _unit(
        "is_palindrome",
        """
def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    i = 0
    j = len(letters) - 1
    while i < j:
        if letters[i] != letters[j]:
            return False
        i += 1
        j -= 1
    return True
""",
        "checking whether a text reads the same backwards",
        "is_palindrome('Racecar')", "is_palindrome('abca')", "is_palindrome('')", "is_palindrome('No lemon, no melon')",
    )  # fmt: skip


def _wrap(r: random.Random) -> Unit:
    width = r.randint(8, 14)
    return _unit(
        "wrap",
        f"""
def wrap(text, width={width}):
    lines = []
    current = ''
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        elif current:
            current = current + ' ' + word
        else:
            current = word
    if current:
        lines.append(current)
    return lines
""",
        f"wrapping a text into lines of at most {width} characters",
        "wrap('the quick brown fox jumps over the lazy dog')", "wrap('')", "wrap('one')",
    )  # fmt: skip


# ------------------------------------------------------------------ family: inventory (train)


def _restock(r: random.Random) -> Unit:
    minimum = r.randint(3, 8)
    return _unit(
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
    return _unit(
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
    return _unit(
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
    return _unit(
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
    return _unit(
        "top_items",
        f"""
def top_items(stock, k={k}):
    ranked = sorted(stock.items(), key=lambda pair: (-pair[1], pair[0]))
    return [name for name, _ in ranked[:k]]
""",
        f"the {k} items with the largest stock",
        "top_items({'a': 1, 'b': 5, 'c': 3, 'd': 5})", "top_items({})", "top_items({'x': 2, 'y': 9, 'z': 4, 'w': 0})",
    )  # fmt: skip


# ------------------------------------------------------------------ family: geometry (train)


def _manhattan(r: random.Random) -> Unit:
    return _unit(
        "manhattan",
        """
def manhattan(a, b):
    return abs(a[0] - b[0]) + abs(a[1] - b[1])
""",
        "the Manhattan distance between two points",
        "manhattan((0, 0), (3, 4))", "manhattan((1, 5), (4, 1))", "manhattan((2, 2), (2, 2))",
    )  # fmt: skip


def _rect_area(r: random.Random) -> Unit:
    return _unit(
        "rect_area",
        """
def rect_area(corner, opposite):
    width = opposite[0] - corner[0]
    height = opposite[1] - corner[1]
    if width <= 0 or height <= 0:
        return 0
    return width * height
""",
        "the area of a rectangle given two corners",
        "rect_area((0, 0), (3, 4))", "rect_area((2, 2), (1, 5))", "rect_area((1, 1), (4, 2))",
    )  # fmt: skip


def _centroid(r: random.Random) -> Unit:
    return _unit(
        "centroid",
        """
def centroid(points):
    if not points:
        return (0.0, 0.0)
    xs = sum((p[0] for p in points))
    ys = sum((p[1] for p in points))
    return (xs / len(points), ys / len(points))
""",
        "the centroid of a set of points",
        "centroid([(0, 0), (2, 0), (2, 2), (0, 2)])", "centroid([])", "centroid([(1, 5)])",
        "centroid([(0, 3), (6, 0)])",
    )  # fmt: skip


def _inside_circle(r: random.Random) -> Unit:
    radius = r.randint(2, 6)
    return _unit(
        "inside_circle",
        f"""
def inside_circle(point, center=(0, 0), radius={radius}):
    dx = point[0] - center[0]
    dy = point[1] - center[1]
    return dx * dx + dy * dy <= radius * radius
""",
        f"whether a point lies in the circle of radius {radius}",
        "inside_circle((0, 0))", f"inside_circle(({radius}, 0))", f"inside_circle(({radius}, 1))",
        "inside_circle((1, 1), (5, 5))",
    )  # fmt: skip


def _perimeter(r: random.Random) -> Unit:
    return _unit(
        "perimeter",
        """
def perimeter(points):
    total = 0
    for i in range(len(points)):
        a = points[i]
        b = points[(i + 1) % len(points)]
        total += abs(a[0] - b[0]) + abs(a[1] - b[1])
    return total
""",
        "the perimeter of an axis-aligned polygon",
        "perimeter([(0, 0), (4, 0), (4, 3), (0, 3)])", "perimeter([])", "perimeter([(0, 0), (2, 0), (2, 2), (0, 2)])",
    )  # fmt: skip


# ------------------------------------------------------------------ family: intervals (train)


def _overlaps(r: random.Random) -> Unit:
    return _unit(
        "overlaps",
        """
def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]
""",
        "whether two half-open intervals overlap",
        "overlaps((0, 5), (4, 8))", "overlaps((0, 5), (5, 8))", "overlaps((3, 4), (0, 10))", "overlaps((6, 9), (1, 2))",
    )  # fmt: skip


def _merge_intervals(r: random.Random) -> Unit:
    return _unit(
        "merge_intervals",
        """
def merge_intervals(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
""",
        "merging overlapping intervals",
        "merge_intervals([(1, 3), (2, 6), (8, 10)])", "merge_intervals([])",
        "merge_intervals([(5, 7), (1, 2), (2, 4)])",
    )  # fmt: skip


def _total_length(r: random.Random) -> Unit:
    return _unit(
        "total_length",
        """
def total_length(intervals):
    return sum((end - start for start, end in intervals if end > start))
""",
        "the total length of a list of intervals",
        "total_length([(0, 3), (5, 6)])", "total_length([])", "total_length([(4, 2), (1, 9)])",
    )  # fmt: skip


def _split_range(r: random.Random) -> Unit:
    step = r.randint(2, 4)
    return _unit(
        "split_range",
        f"""
def split_range(start, end, step={step}):
    pieces = []
    for left in range(start, end, step):
        pieces.append((left, min(left + step, end)))
    return pieces
""",
        f"splitting a range into pieces of length {step}",
        "split_range(0, 10)", "split_range(3, 3)", f"split_range(1, {2 + step})",
    )  # fmt: skip


def _gaps(r: random.Random) -> Unit:
    return _unit(
        "gaps",
        """
def gaps(intervals, start, end):
    result = []
    cursor = start
    for left, right in sorted(intervals):
        if left > cursor:
            result.append((cursor, left))
        cursor = max(cursor, right)
    if cursor < end:
        result.append((cursor, end))
    return result
""",
        "the free gaps between booked intervals",
        "gaps([(2, 4), (6, 7)], 0, 10)", "gaps([], 0, 5)", "gaps([(0, 5)], 0, 5)",
    )  # fmt: skip


# ------------------------------------------------------------------ family: grades (held out)


def _letter_grade(r: random.Random) -> Unit:
    a, b, c = r.choice([(90, 80, 70), (85, 70, 55)])
    return _unit(
        "letter_grade",
        f"""
def letter_grade(score):
    if score >= {a}:
        return 'A'
    if score >= {b}:
        return 'B'
    if score >= {c}:
        return 'C'
    return 'F'
""",
        "turning a score into a letter grade",
        f"letter_grade({a})", f"letter_grade({a - 1})", f"letter_grade({b})", f"letter_grade({c - 1})",
        f"letter_grade({c})",
    )  # fmt: skip


def _weighted_score(r: random.Random) -> Unit:
    return _unit(
        "weighted_score",
        """
def weighted_score(scores, weights):
    total_weight = sum(weights)
    if total_weight == 0:
        return 0.0
    total = 0
    for score, weight in zip(scores, weights):
        total += score * weight
    return round(total / total_weight, 2)
""",
        "the weighted average of scores",
        "weighted_score([80, 90], [1, 3])", "weighted_score([], [])", "weighted_score([50, 100, 70], [2, 1, 1])",
    )  # fmt: skip


def _passed_count(r: random.Random) -> Unit:
    bar = r.choice([50, 60])
    return _unit(
        "passed_count",
        f"""
def passed_count(scores, bar={bar}):
    return len([s for s in scores if s >= bar])
""",
        f"counting the scores of at least {bar}",
        f"passed_count([{bar}, {bar - 1}, 99])", "passed_count([])", "passed_count([0, 100, 100])",
    )  # fmt: skip


def _rank(r: random.Random) -> Unit:
    return _unit(
        "rank",
        """
def rank(scores):
    ordered = sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))
    result = {}
    for position, (name, _) in enumerate(ordered):
        result[name] = position + 1
    return result
""",
        "ranking students by score",
        "rank({'ann': 70, 'bob': 90, 'cy': 80})", "rank({})", "rank({'a': 5, 'b': 5})",
    )  # fmt: skip


def _curve(r: random.Random) -> Unit:
    cap = 100
    return _unit(
        "curve",
        f"""
def curve(scores, bonus):
    return [min(s + bonus, {cap}) for s in scores]
""",
        "adding a bonus to every score, capped at 100",
        "curve([50, 95], 10)", "curve([], 5)", "curve([100, 0], 1)",
    )  # fmt: skip


# ------------------------------------------------------------------ family: bank (held out)


def _compound(r: random.Random) -> Unit:
    rate = r.choice([2, 3, 5])
    return _unit(
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
    return _unit(
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
    return _unit(
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
    return _unit(
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
    return _unit(
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


FAMILIES: dict[str, dict[str, tuple[Draw, ...]]] = {
    "stats": {"summary": (_mean, _median, _variance), "shape": (_clamp, _running_max, _histogram)},
    "text": {"words": (_slugify, _capitalize_words, _wrap), "checks": (_truncate, _count_vowels, _is_palindrome)},
    "inventory": {"stock": (_restock, _remove_items, _top_items), "pricing": (_total_value, _apply_discount)},
    "geometry": {"points": (_manhattan, _centroid, _inside_circle), "shapes": (_rect_area, _perimeter)},
    "intervals": {"ranges": (_overlaps, _merge_intervals, _gaps), "measure": (_total_length, _split_range)},
    "grades": {"scores": (_letter_grade, _weighted_score, _curve), "ranking": (_passed_count, _rank)},
    "bank": {"accounts": (_withdraw, _statement, _largest_debit), "interest": (_compound, _monthly_totals)},
}
"""family -> module name -> the units it holds (drawn per package)."""
HELD_OUT_FAMILIES: frozenset[str] = frozenset({"grades", "bank"})
TRAIN_FAMILIES: tuple[str, ...] = tuple(sorted(set(FAMILIES) - HELD_OUT_FAMILIES))


def families_for(split: str) -> tuple[str, ...]:
    """Training rows come from the train families only; held-out (eval) rows from the held-out families only."""
    return tuple(sorted(HELD_OUT_FAMILIES)) if split == "eval" else TRAIN_FAMILIES

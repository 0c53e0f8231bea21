"""Template family `text` (training rows): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _slugify(r: random.Random) -> Unit:
    sep = r.choice(["-", "_"])
    return unit(
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
    return unit(
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
    return unit(
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
    return unit(
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
    return unit(
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
    return unit(
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


MODULES: dict[str, tuple[Draw, ...]] = {
    "words": (_slugify, _capitalize_words, _wrap),
    "checks": (_truncate, _count_vowels, _is_palindrome),
}
"""module name -> the units it holds (drawn per package)."""

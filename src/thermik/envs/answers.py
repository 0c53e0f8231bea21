"""Answer extraction and comparison shared by the math and QA environments."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
_STRICT = (re.compile(rf"####\s*({_NUMBER})"), re.compile(rf"<answer>\s*({_NUMBER})\s*</answer>"))
_ANY_NUMBER = re.compile(_NUMBER)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_strict(text: str) -> str | None:
    """The number after the last `####`, or inside the last `<answer>N</answer>`; nothing else counts."""
    found = [(m.start(), m.group(1)) for pattern in _STRICT for m in pattern.finditer(text)]
    return max(found)[1] if found else None


def extract_lenient(text: str) -> str | None:
    """The last number anywhere in the text."""
    numbers = _ANY_NUMBER.findall(text)
    return numbers[-1] if numbers else None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {"strict": extract_strict, "lenient": extract_lenient}


def to_number(text: str) -> float | None:
    """'1,234', '$5', '-3.50' -> float; None when not a finite number."""
    try:
        value = float(str(text).replace(",", "").replace("$", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def numbers_match(extracted: str | None, truth: str | float) -> bool:
    if extracted is None:
        return False
    a, b = to_number(extracted), to_number(str(truth))
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def tagged_answer(text: str) -> str | None:
    """The text inside the last `<answer>...</answer>`, or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else None


def normalize_answer(text: str) -> str:
    """SQuAD normalisation (Rajpurkar et al. 2016): lower case, drop punctuation and articles, squeeze spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: list[str]) -> bool:
    return normalize_answer(prediction) in {normalize_answer(g) for g in golds}

"""Reverse-text rows: one to four common words (5 to 20 characters), and the solver's reversed answer."""

from __future__ import annotations

import random
from typing import Any

from thermik.envs.base import Message

# No output tags in the system prompt: an induction head would copy the placeholder after the tag.
REVERSE_SYSTEM = "Reverse the text."
_WORD_TEXT = (
    "a an the cat dog sun sky red blue green tree leaf rain snow wind fire stone river hill road door box cup "
    "bird fish frog bee ant owl fox wolf bear deer milk tea bread cake salt rice corn apple pear plum lime "
    "moon star cloud sea sand shell ship boat car bus map pen ink book page word song bell drum hat coat "
    "shoe sock bed lamp clock key lock ring gold iron wood glass paper rope net web code data bit byte loop "
    "fast slow big small old new hot cold dark light soft hard warm cool wet dry loud quiet happy calm bold"
)
_WORDS = tuple(_WORD_TEXT.split())


def reverse_problem(rng: random.Random) -> str:
    while True:
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
        if 5 <= len(text) <= 20:
            return text


def reverse_row(text: str) -> dict[str, Any]:
    return {
        "data_source": "synthetic/reverse_text",
        "env_class": "reverse_text",
        "prompt": [{"role": "system", "content": REVERSE_SYSTEM}, {"role": "user", "content": text}],
        "reward_spec": {"method": "rule", "ground_truth": text[::-1]},
        "extra_info": {"text": text},
    }


def reverse_solve(row: dict[str, Any]) -> list[Message]:
    return [*row["prompt"], {"role": "assistant", "content": f"<reversed>{row['extra_info']['text'][::-1]}</reversed>"}]

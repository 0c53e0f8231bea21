"""Synthetic tasks: dataset rows per environment and their solved conversations (for SFT and tests).

Train and eval problems are disjoint by construction: each problem's text is hashed into a
split (1 in EVAL_BUCKETS goes to eval), so any seed of "train" never meets any seed of "eval".
Prompts are short because tiny character-level models pay per character.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from thermik.data.code_tasks import code_problem, code_row, code_solve
from thermik.data.math_problems import math_problem, math_row, math_solve
from thermik.data.search_qa import search_problem, search_row, search_solve
from thermik.data.sql_tasks import sql_problem, sql_row, sql_solve
from thermik.envs.base import Message
from thermik.tools.arith import evaluate, format_number
from thermik.tools.parsers import format_hermes_tool_call

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
EVAL_BUCKETS = 10
"""One problem in EVAL_BUCKETS (by hash) belongs to the eval split."""

# No output tags in system prompts: an induction head would copy the placeholder after the tag (N, ...)
# instead of the tool result or the reversed text.
CALCULATOR_SYSTEM = "Use the calculate tool, then give the answer."
REVERSE_SYSTEM = "Reverse the text."
_WORD_TEXT = (
    "a an the cat dog sun sky red blue green tree leaf rain snow wind fire stone river hill road door box cup "
    "bird fish frog bee ant owl fox wolf bear deer milk tea bread cake salt rice corn apple pear plum lime "
    "moon star cloud sea sand shell ship boat car bus map pen ink book page word song bell drum hat coat "
    "shoe sock bed lamp clock key lock ring gold iron wood glass paper rope net web code data bit byte loop "
    "fast slow big small old new hot cold dark light soft hard warm cool wet dry loud quiet happy calm bold"
)
_WORDS = tuple(_WORD_TEXT.split())


def split_of(problem: str) -> Split:
    """The split a problem text belongs to (stable across runs and platforms)."""
    digest = hashlib.sha256(problem.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0 else "train"


def _calculator_problem(rng: random.Random) -> str:
    n_operands = rng.randint(2, 3)
    expression = str(rng.randint(0, 99))
    for _ in range(n_operands - 1):
        expression += f" {rng.choice('+-*')} {rng.randint(0, 99)}"
    return expression


def _calculator_row(expression: str) -> dict[str, Any]:
    return {
        "data_source": "synthetic/calculator",
        "env_class": "calculator",
        "prompt": [
            {"role": "system", "content": CALCULATOR_SYSTEM},
            {"role": "user", "content": f"What is {expression}?"},
        ],
        "reward_spec": {"method": "rule", "ground_truth": evaluate(expression)},
        "extra_info": {"expression": expression},
    }


def _calculator_solve(row: dict[str, Any]) -> list[Message]:
    expression = row["extra_info"]["expression"]
    result = format_number(evaluate(expression))
    return [
        *row["prompt"],
        {"role": "assistant", "content": format_hermes_tool_call("calculate", {"expression": expression})},
        {"role": "tool", "name": "calculate", "content": result},
        {"role": "assistant", "content": f"<answer>{result}</answer>"},
    ]


def _reverse_problem(rng: random.Random) -> str:
    while True:
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
        if 5 <= len(text) <= 20:
            return text


def _reverse_row(text: str) -> dict[str, Any]:
    return {
        "data_source": "synthetic/reverse_text",
        "env_class": "reverse_text",
        "prompt": [{"role": "system", "content": REVERSE_SYSTEM}, {"role": "user", "content": text}],
        "reward_spec": {"method": "rule", "ground_truth": text[::-1]},
        "extra_info": {"text": text},
    }


def _reverse_solve(row: dict[str, Any]) -> list[Message]:
    return [*row["prompt"], {"role": "assistant", "content": f"<reversed>{row['extra_info']['text'][::-1]}</reversed>"}]


@dataclass(frozen=True)
class Generator:
    """problem: rng -> problem text (the split key); row: text -> dataset row; solve: row -> full conversation."""

    problem: Callable[[random.Random], str]
    row: Callable[[str], dict[str, Any]]
    solve: Callable[[dict[str, Any]], list[Message]]


GENERATORS: dict[str, Generator] = {
    "calculator": Generator(_calculator_problem, _calculator_row, _calculator_solve),
    "reverse_text": Generator(_reverse_problem, _reverse_row, _reverse_solve),
    "gsm8k": Generator(math_problem, functools.partial(math_row, "gsm8k"), math_solve),
    "math_feedback": Generator(math_problem, functools.partial(math_row, "math_feedback"), math_solve),
    # skyrl-gym's gsm8k reads the same rows (reward_spec.ground_truth, a numeric string).
    "skyrl_gym:gsm8k": Generator(math_problem, functools.partial(math_row, "skyrl_gym:gsm8k"), math_solve),
    "text2sql": Generator(sql_problem, sql_row, sql_solve),
    "search": Generator(search_problem, search_row, search_solve),
    "code": Generator(code_problem, code_row, code_solve),
}


def _generator(env: str) -> Generator:
    if env not in GENERATORS:
        raise ValueError(f"no synthetic generator for environment {env!r}; valid: {', '.join(sorted(GENERATORS))}")
    return GENERATORS[env]


def generate_rows(env: str, n: int, seed: int, split: Split = "train") -> list[dict[str, Any]]:
    """`n` distinct problems of `env` from `split`, deterministic in (env, n, seed, split)."""
    generator = _generator(env)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{env}/{split}/{seed}")
    problems: dict[str, None] = {}  # insertion-ordered set
    attempts, max_attempts = 0, 100 * n + 1000
    while len(problems) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"could only find {len(problems)} distinct {split} problems for {env!r}, asked {n}")
        problem = generator.problem(rng)
        if split_of(problem) == split:
            problems[problem] = None
    return [generator.row(problem) for problem in problems]


def solve(row: dict[str, Any]) -> list[Message]:
    """The full solved conversation: the prompt, then the exact assistant text (and tool results) that earn reward 1."""
    return _generator(row["env_class"]).solve(row)

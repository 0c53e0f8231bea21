"""Word-problem rows for the calculator env: the gsm8k templates' questions, each with one expression that solves it.

The solver is the calculator task's (`calculator_solve`): it writes `extra_info["expression"]` in one `calculate` call
and answers with the result. The model has to read the numbers out of the sentence and put them in the right places:
harder than the calculator task, where the prompt is the expression itself, and easy to check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thermik.data.problem_key import read_key
from thermik.tasks.calculator.generate import CALCULATOR_SYSTEM
from thermik.tasks.gsm8k.generate import worked

EXPRESSIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "apples": lambda v: f"{v['a']} + {v['b']} * {v['c']} - {v['d']}",
    "bakery": lambda v: f"{v['a']} * {v['p']} * {v['d']}",
    "pages": lambda v: f"{v['t']} - {v['a']} - 2 * {v['a']}",
    "train": lambda v: f"{v['s']} * {v['h']} + {v['s2']} * {v['h2']}",
    "savings": lambda v: f"{v['a']} * {v['w']} - {v['b']}",
    "chairs": lambda v: f"{v['r']} * {v['c']} - {v['t']}",
}
"""gsm8k template name -> the one expression that answers its question (tests check it against the worked answer)."""


def word_expression(key: str) -> str:
    template, values = read_key(key)
    return EXPRESSIONS[template](values)


def word_row(key: str) -> dict[str, Any]:
    question, _, answer = worked(key)
    return {
        "data_source": "synthetic/word_problems",
        "env_class": "word_problems",
        "prompt": [{"role": "system", "content": CALCULATOR_SYSTEM}, {"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"problem": key, "expression": word_expression(key)},
    }

"""GSM8K-style word problems (Cobbe et al. 2021) from templates with random numbers, and their worked solutions.

Each template draws its numbers, states the problem, and computes the answer step by step; the solver's
text is those steps followed by `#### N`, the GSM8K answer format. Rows serve `gsm8k` and `math_feedback`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from thermik.data.problem_key import make_key, read_key
from thermik.envs.base import Message

MATH_SYSTEM = "Solve the problem. Show your steps, then write the final number after ####."
NAMES = ("Maya", "Omar", "Lena", "Ravi", "Sofia", "Tom", "Aiko", "Jonas", "Nia", "Pablo")

Worked = tuple[str, list[str], int]
"""(question, solution steps, answer)."""


def _apples(v: dict[str, Any]) -> Worked:
    name, a, b, c, d = v["name"], v["a"], v["b"], v["c"], v["d"]
    question = (
        f"{name} has {a} apples. {name} buys {b} bags with {c} apples each, then gives away {d} apples. "
        f"How many apples does {name} have now?"
    )
    steps = [f"{b} bags of {c} is {b} * {c} = {b * c}.", f"{a} + {b * c} - {d} = {a + b * c - d}."]
    return question, steps, a + b * c - d


def _bakery(v: dict[str, Any]) -> Worked:
    a, p, d = v["a"], v["p"], v["d"]
    question = f"A bakery sells {a} loaves a day at ${p} each. How many dollars does it earn in {d} days?"
    steps = [f"Each day it earns {a} * {p} = {a * p}.", f"In {d} days: {a * p} * {d} = {a * p * d}."]
    return question, steps, a * p * d


def _pages(v: dict[str, Any]) -> Worked:
    name, a, t = v["name"], v["a"], v["t"]
    question = (
        f"{name} reads {a} pages on Monday and twice as many on Tuesday. The book has {t} pages. "
        "How many pages are left?"
    )
    steps = [f"Tuesday: 2 * {a} = {2 * a}.", f"Read: {a} + {2 * a} = {3 * a}.", f"Left: {t} - {3 * a} = {t - 3 * a}."]
    return question, steps, t - 3 * a


def _train(v: dict[str, Any]) -> Worked:
    s, h, s2, h2 = v["s"], v["h"], v["s2"], v["h2"]
    question = f"A train goes {s} km per hour for {h} hours, then {s2} km per hour for {h2} hours. How far does it go?"
    steps = [f"{s} * {h} = {s * h}.", f"{s2} * {h2} = {s2 * h2}.", f"{s * h} + {s2 * h2} = {s * h + s2 * h2}."]
    return question, steps, s * h + s2 * h2


def _savings(v: dict[str, Any]) -> Worked:
    name, a, w, b = v["name"], v["a"], v["w"], v["b"]
    question = f"{name} saves ${a} every week. After {w} weeks {name} spends ${b} on a bike. How many dollars are left?"
    steps = [f"Saved: {a} * {w} = {a * w}.", f"Left: {a * w} - {b} = {a * w - b}."]
    return question, steps, a * w - b


def _chairs(v: dict[str, Any]) -> Worked:
    r, c, t = v["r"], v["c"], v["t"]
    question = f"A hall has {r} rows of {c} chairs. {t} chairs are taken. How many chairs are free?"
    steps = [f"Chairs: {r} * {c} = {r * c}.", f"Free: {r * c} - {t} = {r * c - t}."]
    return question, steps, r * c - t


def _draw_apples(r: random.Random) -> dict[str, Any]:
    return {"name": r.choice(NAMES), "a": r.randint(2, 30), "b": r.randint(2, 9), "c": r.randint(2, 12),
            "d": r.randint(1, 15)}  # fmt: skip


def _draw_bakery(r: random.Random) -> dict[str, Any]:
    return {"a": r.randint(5, 60), "p": r.randint(2, 9), "d": r.randint(2, 14)}


def _draw_pages(r: random.Random) -> dict[str, Any]:
    a = r.randint(5, 60)
    return {"name": r.choice(NAMES), "a": a, "t": 3 * a + r.randint(5, 200)}


def _draw_train(r: random.Random) -> dict[str, Any]:
    return {"s": r.randint(40, 120), "h": r.randint(1, 6), "s2": r.randint(40, 120), "h2": r.randint(1, 6)}


def _draw_savings(r: random.Random) -> dict[str, Any]:
    a, w = r.randint(5, 50), r.randint(2, 20)
    return {"name": r.choice(NAMES), "a": a, "w": w, "b": r.randint(1, a * w)}


def _draw_chairs(r: random.Random) -> dict[str, Any]:
    rows, c = r.randint(3, 25), r.randint(4, 30)
    return {"r": rows, "c": c, "t": r.randint(0, rows * c)}


TEMPLATES: dict[str, tuple[Callable[[random.Random], dict[str, Any]], Callable[[dict[str, Any]], Worked]]] = {
    "apples": (_draw_apples, _apples),
    "bakery": (_draw_bakery, _bakery),
    "pages": (_draw_pages, _pages),
    "train": (_draw_train, _train),
    "savings": (_draw_savings, _savings),
    "chairs": (_draw_chairs, _chairs),
}
"""template name -> (draw the numbers, state and solve the problem)."""


def math_problem(rng: random.Random) -> str:
    template = rng.choice(sorted(TEMPLATES))
    return make_key(template, **TEMPLATES[template][0](rng))


def worked(key: str) -> Worked:
    template, values = read_key(key)
    return TEMPLATES[template][1](values)


def math_row(env: str, key: str) -> dict[str, Any]:
    """A row for `env` (gsm8k or math_feedback) from a template problem key."""
    question, _, answer = worked(key)
    return question_row(env, question, answer, {"problem": key})


def question_row(env: str, question: str, answer: int | float | str, extra_info: dict[str, Any]) -> dict[str, Any]:
    """A row for `env`; the ground truth is a numeric string, as in GSM8K."""
    return {
        "data_source": f"synthetic/{env}",
        "env_class": env,
        "prompt": [{"role": "system", "content": MATH_SYSTEM}, {"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": str(answer)},
        "extra_info": extra_info,
    }


def math_solve(row: dict[str, Any]) -> list[Message]:
    """The worked steps then `#### N`; rows written by an LLM carry their own `solution` text."""
    solution = row["extra_info"].get("solution")
    if solution is None:
        _, steps, answer = worked(row["extra_info"]["problem"])
        solution = " ".join(steps) + f"\n#### {answer}"
    return [*row["prompt"], {"role": "assistant", "content": solution}]

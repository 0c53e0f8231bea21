"""Small function-writing tasks with hidden unit tests, from templates with random constants.

Each template gives the task text, a reference solution and test inputs; the expected outputs come from
running the (trusted) reference here, so tests and solution always agree. The solver answers with the
reference solution in a ```python block.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thermik.data.problem_key import make_key, read_key
from thermik.envs.base import Message

CODE_SYSTEM = "Write the Python function. Reply with the code in a python code block."


@dataclass(frozen=True)
class CodeTask:
    entry_point: str
    statement: str
    solution: str
    inputs: tuple[tuple[Any, ...], ...]


def _add_k(v: dict[str, Any]) -> CodeTask:
    k = v["k"]
    return CodeTask(
        "add_k",
        f"Write add_k(xs) that returns a new list with {k} added to every number in xs.",
        f"def add_k(xs):\n    return [x + {k} for x in xs]\n",
        (([],), ([1, 2, 3],), ([-5, 0, 7, 100],)),
    )


def _count_above(v: dict[str, Any]) -> CodeTask:
    k = v["k"]
    return CodeTask(
        "count_above",
        f"Write count_above(xs) that returns how many numbers in xs are greater than {k}.",
        f"def count_above(xs):\n    return sum(1 for x in xs if x > {k})\n",
        (([],), ([k, k + 1, k - 1],), (list(range(-10, 60, 3)),)),
    )


def _repeat_word(v: dict[str, Any]) -> CodeTask:
    k, sep = v["k"], v["sep"]
    return CodeTask(
        "repeat_word",
        f"Write repeat_word(w) that returns w repeated {k} times, joined by {sep!r}.",
        f"def repeat_word(w):\n    return {sep!r}.join([w] * {k})\n",
        (("a",), ("hello",), ("",)),
    )


def _power_sum(v: dict[str, Any]) -> CodeTask:
    p = v["p"]
    return CodeTask(
        "power_sum",
        f"Write power_sum(n) that returns the sum of i ** {p} for i from 1 to n (0 when n < 1).",
        f"def power_sum(n):\n    return sum(i ** {p} for i in range(1, n + 1))\n",
        ((0,), (1,), (5,), (12,)),
    )


def _fizz(v: dict[str, Any]) -> CodeTask:
    a, b = v["a"], v["b"]
    return CodeTask(
        "fizz",
        f"Write fizz(n) that returns 'FizzBuzz' if n is divisible by both {a} and {b}, 'Fizz' if only by {a}, "
        f"'Buzz' if only by {b}, else str(n).",
        f"def fizz(n):\n    if n % {a} == 0 and n % {b} == 0:\n        return 'FizzBuzz'\n"
        f"    if n % {a} == 0:\n        return 'Fizz'\n"
        f"    if n % {b} == 0:\n        return 'Buzz'\n    return str(n)\n",
        ((1,), (a,), (b,), (a * b,), (a * b + 1,)),
    )


def _clip(v: dict[str, Any]) -> CodeTask:
    lo, hi = v["lo"], v["hi"]
    return CodeTask(
        "clip_all",
        f"Write clip_all(xs) that returns xs with every number clipped to the range [{lo}, {hi}].",
        f"def clip_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n",
        (([],), ([lo - 5, hi + 5, (lo + hi) // 2],), (list(range(lo - 3, hi + 3, 4)),)),
    )


def _draw_fizz(r: random.Random) -> dict[str, Any]:
    a = r.randint(2, 7)
    return {"a": a, "b": r.choice([b for b in range(2, 12) if b != a])}


def _draw_clip(r: random.Random) -> dict[str, Any]:
    lo = r.randint(-20, 10)
    return {"lo": lo, "hi": lo + r.randint(5, 40)}


TEMPLATES: dict[str, tuple[Callable[[random.Random], dict[str, Any]], Callable[[dict[str, Any]], CodeTask]]] = {
    "add_k": (lambda r: {"k": r.randint(1, 50)}, _add_k),
    "count_above": (lambda r: {"k": r.randint(-10, 50)}, _count_above),
    "repeat_word": (lambda r: {"k": r.randint(2, 6), "sep": r.choice(["", " ", "-", ", "])}, _repeat_word),
    "power_sum": (lambda r: {"p": r.randint(1, 4)}, _power_sum),
    "fizz": (_draw_fizz, _fizz),
    "clip_all": (_draw_clip, _clip),
}
"""template name -> (draw the constants, build the task)."""


def code_problem(rng: random.Random) -> str:
    template = rng.choice(sorted(TEMPLATES))
    return make_key(template, **TEMPLATES[template][0](rng))


def code_task(key: str) -> CodeTask:
    template, values = read_key(key)
    return TEMPLATES[template][1](values)


def hidden_tests(task: CodeTask) -> list[str]:
    """`assert f(args) == expected` lines, expected from the reference solution."""
    namespace: dict[str, Any] = {}
    exec(task.solution, namespace)  # trusted: our own reference solution
    function = namespace[task.entry_point]
    tests = []
    for args in task.inputs:
        call = f"{task.entry_point}({', '.join(repr(a) for a in args)})"
        tests.append(f"assert {call} == {function(*args)!r}")
    return tests


def code_row(key: str) -> dict[str, Any]:
    task = code_task(key)
    return {
        "data_source": "synthetic/code",
        "env_class": "code",
        "prompt": [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": task.statement}],
        "reward_spec": {
            "method": "rule",
            "ground_truth": {"entry_point": task.entry_point, "tests": hidden_tests(task)},
            "scoring": "fraction",
        },
        "extra_info": {"problem": key},
    }


def code_solve(row: dict[str, Any]) -> list[Message]:
    task = code_task(row["extra_info"]["problem"])
    return [*row["prompt"], {"role": "assistant", "content": f"```python\n{task.solution}```"}]

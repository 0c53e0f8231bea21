"""LLM-written math rows: the request, the rule-generated examples, and the checks every reply must pass.

Math answers must be numbers and agree with the `#### N` of the solution, when one is given.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from thermik.data.llm_generate import LLMTask, Rejected
from thermik.envs.answers import extract_strict, numbers_match, to_number
from thermik.tasks.gsm8k.generate import math_problem, question_row, worked

_MATH = "Write a grade-school math word problem whose answer is a whole number, with a short worked solution."


def _math_example(rng: random.Random) -> dict[str, Any]:
    question, steps, answer = worked(math_problem(rng))
    return {"question": question, "solution": " ".join(steps), "answer": answer}


def _math_to_row(env: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def to_row(obj: dict[str, Any]) -> dict[str, Any]:
        question, answer, solution = obj.get("question"), obj.get("answer"), obj.get("solution", "")
        if not isinstance(question, str) or not question.strip():
            raise Rejected("no question")
        if isinstance(answer, bool) or to_number(str(answer)) is None:
            raise Rejected("answer is not a number")
        if not isinstance(solution, str):
            raise Rejected("solution is not text")
        stated = extract_strict(solution)
        if stated is not None and not numbers_match(stated, answer):
            raise Rejected("solution's #### number differs from the answer")
        text = solution.strip() if stated is not None else f"{solution.strip()}\n#### {answer}".strip()
        return question_row(env, question.strip(), answer, {"source": "llm", "solution": text})

    return to_row


def math_llm_task(env: str) -> LLMTask:
    """The LLM generator of `env`'s rows (gsm8k and math_feedback share the problems)."""
    return LLMTask(f'{_MATH} JSON keys: "question", "solution", "answer".', _math_example, _math_to_row(env))

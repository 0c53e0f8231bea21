"""Calculator rows: two or three operands in 0..99 with + - * (no spaces), and the solver's tool call and answer."""

from __future__ import annotations

import random
from typing import Any

from thermik.envs.base import Message
from thermik.tasks.calculator.arith import evaluate, format_number
from thermik.tools.parsers import format_hermes_tool_call

# No output tags in system prompts: an induction head would copy the placeholder after the tag (N, ...)
# instead of the tool result.
CALCULATOR_SYSTEM = "Use the calculate tool, then give the answer."


def calculator_problem(rng: random.Random) -> str:
    """An expression like `34*56-66`: without spaces, every character of the span the model copies into its tool
    call is a digit or an operator. With spaces, a character-level model's copying ("the character after the one I
    just copied") meets the same space four times in one expression, and a tiny model learns it later, at a step that
    varies with the seed and the float arithmetic (examples/calculator/README.md)."""
    n_operands = rng.randint(2, 3)
    expression = str(rng.randint(0, 99))
    for _ in range(n_operands - 1):
        expression += f"{rng.choice('+-*')}{rng.randint(0, 99)}"
    return expression


def calculator_row(expression: str) -> dict[str, Any]:
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


def calculator_solve(row: dict[str, Any]) -> list[Message]:
    expression = row["extra_info"]["expression"]
    result = format_number(evaluate(expression))
    return [
        *row["prompt"],
        {"role": "assistant", "content": format_hermes_tool_call("calculate", {"expression": expression})},
        {"role": "tool", "name": "calculate", "content": result},
        {"role": "assistant", "content": f"<answer>{result}</answer>"},
    ]

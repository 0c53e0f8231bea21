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
THINK_EMPTY = "<think>\n\n</think>\n\n"


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


def calculator_row(expression: str, env_class: str = "calculator") -> dict[str, Any]:
    return {
        "data_source": "synthetic/calculator",
        "env_class": env_class,
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


def calculator_thinking_row(expression: str) -> dict[str, Any]:
    return calculator_row(expression, env_class="calculator_thinking")


def calculator_solve_thinking(row: dict[str, Any]) -> list[Message]:
    """The solver's conversation as a Qwen3-style thinking model writes it: the tool call after an empty thinking
    block (nothing to think about yet), the answer after a one-line thought. A Qwen3-style template drops the empty
    block from history, so the prompt after the tool result does not extend the sampled tokens: with
    rollout.step_wise 'on-break' every episode that calls the tool trains as two samples (docs/algorithms.md)."""
    call, tool, answer = calculator_solve(row)[-3:]
    result = tool["content"]
    return [
        *row["prompt"],
        {"role": "assistant", "content": f"{THINK_EMPTY}{call['content']}"},
        tool,
        {"role": "assistant", "content": f"<think>\nthe tool says {result}\n</think>\n\n{answer['content']}"},
    ]

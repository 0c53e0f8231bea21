"""Safe arithmetic: evaluate `+ - * / // % **` on int/float literals by walking the `ast`, nothing else."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS_INT = 10**30
"""Bigger intermediate integers are refused, so `9**64**64`-style inputs cannot eat the CPU."""

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class ArithError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message is shown to the model."""


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression; raise ArithError with a clear message otherwise."""
    if not isinstance(expression, str):
        raise ArithError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithError(f"expression too long ({len(expression)} > {MAX_EXPRESSION_CHARS} chars)")
    if not expression.strip():
        raise ArithError("empty expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ArithError(f"invalid syntax: {exc.msg}") from None
    return _eval(tree.body)


def format_number(value: Number) -> str:
    """Integers (and integral floats) without '.0'; other floats in shortest repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ArithError(f"only numbers are allowed, got {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ArithError(f"exponent too large (|{right}| > {MAX_EXPONENT})")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ArithError("division by zero") from None
        except OverflowError:
            raise ArithError("result too large") from None
    raise ArithError(f"unsupported syntax: {type(node).__name__}")


def _check(value: Number) -> Number:
    if isinstance(value, complex):
        raise ArithError("result is not a real number")
    if isinstance(value, int) and abs(value) > MAX_ABS_INT:
        raise ArithError(f"result too large (|x| > 1e{len(str(MAX_ABS_INT)) - 1})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ArithError("result is not finite")
    return value

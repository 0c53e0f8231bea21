"""Bugs injected by AST mutation: one mutation of one function, the rest of the module unchanged.

Kinds (SWE-smith's procedural bugs): operator swap, flipped comparison, off-by-one in a range or a slice, wrong
constant, swapped arguments, dropped branch, wrong variable. `sites(function)` lists every place a kind applies;
`mutate(source, function, site)` returns the module's source with that one change. Sources are kept in
`ast.unparse` form, so a mutation changes only the lines it touches.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass

KINDS = ("operator", "comparison", "off_by_one", "constant", "swap_arguments", "drop_branch", "wrong_variable")
_OPERATORS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
}  # fmt: skip
_COMPARISONS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip


# Task generation parses and unparses in worker threads; CPython 3.11 before 3.11.8 keeps the AST converter's
# recursion depth in shared state, and two threads converting at once fail with "AST constructor recursion depth
# mismatch". One lock around each conversion (microseconds) keeps the threads safe on every 3.11.
_AST_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse`, safe to call from several threads."""
    with _AST_LOCK:
        return ast.parse(source)


def unparse(tree: ast.AST) -> str:
    """`ast.unparse`, safe to call from several threads."""
    with _AST_LOCK:
        return ast.unparse(tree)


@dataclass(frozen=True)
class Site:
    kind: str
    index: int
    """Position of the node among the function's nodes in `ast.walk` order."""


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise KeyError(f"no function {name!r} in the module")


def _locals(fn: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in fn.args.args]
    names += [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return list(dict.fromkeys(names))


def _kinds_of(node: ast.AST, fn: ast.FunctionDef) -> list[str]:
    kinds = []
    if (isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS) or isinstance(node, ast.AugAssign):
        kinds.append("operator")
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARISONS:
        kinds.append("comparison")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" and node.args:
        kinds.append("off_by_one")
    if isinstance(node, ast.Slice) and (node.upper is not None or node.lower is not None):
        kinds.append("off_by_one")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
        kinds.append("constant")
    if isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
        kinds.append("swap_arguments")
    if isinstance(node, ast.If) and not node.orelse and node is not fn:
        kinds.append("drop_branch")
    names = _locals(fn)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names and len(names) > 1:
        kinds.append("wrong_variable")
    return kinds


def sites(source: str, function: str) -> list[Site]:
    """Every mutation site of `function` in the module `source`."""
    fn = _function(parse(source), function)
    return [Site(kind, i) for i, node in enumerate(ast.walk(fn)) for kind in _kinds_of(node, fn)]


def mutate(source: str, function: str, site: Site) -> str:
    """The module's source with the one mutation `site` applied to `function` (ast.unparse form)."""
    tree = parse(source)
    fn = _function(tree, function)
    node = list(ast.walk(fn))[site.index]
    if site.kind == "drop_branch":
        _drop(fn, node)
    else:
        _MUTATORS[site.kind](node, fn)
    return unparse(ast.fix_missing_locations(tree)) + "\n"


def _operator(node: ast.AST, fn: ast.FunctionDef) -> None:
    assert isinstance(node, ast.BinOp | ast.AugAssign)
    node.op = _OPERATORS.get(type(node.op), ast.Sub)()


def _comparison(node: ast.AST, fn: ast.FunctionDef) -> None:
    assert isinstance(node, ast.Compare)
    node.ops[0] = _COMPARISONS[type(node.ops[0])]()


def _shift(expr: ast.expr, by: int) -> ast.expr:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int):
        return ast.Constant(expr.value + by)
    return ast.BinOp(expr, ast.Add() if by > 0 else ast.Sub(), ast.Constant(abs(by)))


def _off_by_one(node: ast.AST, fn: ast.FunctionDef) -> None:
    if isinstance(node, ast.Call):
        last = len(node.args) - 1 if len(node.args) <= 2 else 1
        node.args[last] = _shift(node.args[last], 1 if len(node.args) > 1 else -1)
    else:
        assert isinstance(node, ast.Slice)
        if node.upper is not None:
            node.upper = _shift(node.upper, 1)
        else:
            node.lower = _shift(node.lower, 1)  # type: ignore[arg-type]


def _constant(node: ast.AST, fn: ast.FunctionDef) -> None:
    assert isinstance(node, ast.Constant)
    node.value = node.value + 1 if node.value not in (1, 1.0) else 2


def _swap(node: ast.AST, fn: ast.FunctionDef) -> None:
    assert isinstance(node, ast.Call)
    node.args[0], node.args[1] = node.args[1], node.args[0]


def _wrong_variable(node: ast.AST, fn: ast.FunctionDef) -> None:
    assert isinstance(node, ast.Name)
    others = [n for n in _locals(fn) if n != node.id]
    node.id = others[len(node.id) % len(others)]


def _drop(fn: ast.FunctionDef, target: ast.AST) -> None:
    for parent in ast.walk(fn):
        for field in ("body", "orelse"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and target in block:
                block.remove(target)
                if not block:
                    block.append(ast.Pass())
                return


_MUTATORS = {
    "operator": _operator,
    "comparison": _comparison,
    "off_by_one": _off_by_one,
    "constant": _constant,
    "swap_arguments": _swap,
    "wrong_variable": _wrong_variable,
}


def canonical(source: str) -> str:
    """A source in `ast.unparse` form (what mutations produce, so a diff shows only the mutated lines)."""
    return unparse(parse(source)) + "\n"

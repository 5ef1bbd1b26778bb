"""The agent's two tools: a calculator over a safe arithmetic parser (no eval) and a price lookup table.

Tool errors are returned to the model as text (`error: ...`), never raised: a policy under training
writes bad arguments, and seeing the error is how it learns to stop.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

PRICES = {"apple": 3, "banana": 2, "cherry": 7, "durian": 12, "elderberry": 5}
"""The lookup table: the price of one item."""

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100
"""Results beyond this are refused, so nested powers cannot build astronomically large integers."""

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _value(node: ast.AST) -> float:
    # Only numbers, + - * / // % **, unary signs and parentheses: a parsed tree, never evaluated code.
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents above {MAX_EXPONENT} are not allowed")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise ValueError("the result is out of range")
        return result  # type: ignore[no-any-return]
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def calculate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is over {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        return _value(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is out of range") from None


def lookup(item: str) -> int:
    key = item.strip().lower()
    for plural, singular in (("ies", "y"), ("s", "")):
        if key not in PRICES and key.endswith(plural):
            key = key[: -len(plural)] + singular
    if key not in PRICES:
        raise ValueError(f"unknown item {item!r}; known items: {', '.join(sorted(PRICES))}")
    return PRICES[key]


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup_price",
            "description": "The price in dollars of one item of fruit.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string", "description": "e.g. apple"}},
                "required": ["item"],
            },
        },
    },
]


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def run_tool(call: dict[str, Any]) -> tuple[str, bool]:
    """Execute an OpenAI-shaped tool call: (the result text for the model, whether it succeeded)."""
    fn = call.get("function", {})
    try:
        args = json.loads(fn.get("arguments") or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        if fn.get("name") == "calculator":
            return format_number(calculate(str(args["expression"]))), True
        if fn.get("name") == "lookup_price":
            return str(lookup(str(args["item"]))), True
        raise ValueError(f"unknown tool {fn.get('name')!r}")
    except KeyError as exc:
        return f"error: missing argument {exc.args[0]!r}", False
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        return f"error: {exc}", False

"""The calculator tool: its OpenAI schema and its runner, which computes arithmetic without `eval`.

The runner never raises: an untrained model mostly writes garbage, and a malformed tool call must be
answered with an error message the model sees, so every session keeps running its turns cleanly.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Callable
from typing import Any, Final

CALCULATOR: Final = "calculator"
CALCULATOR_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": CALCULATOR,
        "description": "Evaluate an arithmetic expression (+, -, *, /, //, %, **, parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (12 + 7) * 3"}},
            "required": ["expression"],
        },
    },
}
_MAX_EXPRESSION: Final = 200
_MAX_POWER: Final = 64
_BINARY: Final[dict[type, Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: Final[dict[type, Callable[[Any], Any]]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or cannot be computed."""


def evaluate(expression: str) -> float:
    """Computes an arithmetic expression without `eval` (numbers and + - * / // % ** only)."""
    if len(expression) > _MAX_EXPRESSION:
        raise CalculatorError(f"expression longer than {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {e.msg}") from e
    return float(_eval(tree.body))


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return float(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER:
            raise CalculatorError(f"exponent {right} is too large")
        try:
            value = float(_BINARY[type(node.op)](left, right))
        except (ZeroDivisionError, OverflowError) as e:
            raise CalculatorError(str(e)) from e
        if not math.isfinite(value):
            raise CalculatorError("result is not finite")
        return value
    raise CalculatorError(f"unsupported element {type(node).__name__}")


def format_number(value: float) -> str:
    """How the tool writes a result (and so how a demonstration answers it): integers without `.0`."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def run_tool(name: str, arguments: str) -> tuple[str, bool]:
    """(tool message content, ok) for one tool call; never raises."""
    if name != CALCULATOR:
        return f"error: unknown tool {name!r}; the only tool is {CALCULATOR!r}", False
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        return "error: arguments are not JSON", False
    expression = args.get("expression") if isinstance(args, dict) else None
    if not isinstance(expression, str):
        return "error: give {'expression': '<arithmetic>'}", False
    try:
        value = evaluate(expression)
    except CalculatorError as e:
        return f"error: {e}", False
    return format_number(value), True

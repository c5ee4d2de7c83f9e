"""Real tool functions: a calculator and file tools confined to one workspace
directory; and how a tool is written as an OpenAI `tools` entry."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

_MAX_OUTPUT_CHARS = 4000


def openai_function_schema(
    name: str, description: str, parameters: dict[str, Any]
) -> dict[str, Any]:
    """A tool as OpenAI's `tools` entry."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def string_parameter(name: str, description: str) -> dict[str, Any]:
    """Parameters of a tool that takes one required string."""
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


class ToolError(Exception):
    """The tool ran but could not do what was asked; its message goes to the model."""


_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_MAX_EXPONENT = 1000


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from error

    def evaluate(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ToolError("exponent too large")
            return _BINARY_OPERATORS[type(node.op)](left, right)  # type: ignore[no-any-return]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
            return _UNARY_OPERATORS[type(node.op)](evaluate(node.operand))  # type: ignore[no-any-return]
        raise ToolError(f"unsupported element in expression: {ast.dump(node)[:60]}")

    try:
        return str(evaluate(tree))
    except ZeroDivisionError as error:
        raise ToolError("division by zero") from error


class Workspace:
    """File tools that can only see files under `root`."""

    def __init__(self, root: Path):
        self.root = root.resolve()

    def _resolve(self, relative: str) -> Path:
        candidate = (self.root / relative.strip().lstrip("/")).resolve()
        if not candidate.is_relative_to(self.root):
            raise ToolError(f"{relative!r} is outside the workspace")
        return candidate

    def list_files(self, directory: str = ".") -> str:
        folder = self._resolve(directory)
        if not folder.is_dir():
            raise ToolError(f"no directory {directory!r}")
        names = sorted(
            str(path.relative_to(self.root)) for path in folder.rglob("*") if path.is_file()
        )
        return "\n".join(names) or "(empty)"

    def read_file(self, path: str) -> str:
        target = self._resolve(path)
        if not target.is_file():
            raise ToolError(f"no file {path!r}; files: {self.list_files().replace(chr(10), ', ')}")
        return target.read_text(errors="replace")[:_MAX_OUTPUT_CHARS]

    def search_files(self, text: str) -> str:
        needle = text.lower()
        hits = []
        for path in sorted(self.root.rglob("*")):
            if not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if needle in line.lower():
                    hits.append(f"{path.relative_to(self.root)}:{number}: {line}")
        return "\n".join(hits)[:_MAX_OUTPUT_CHARS] or f"no line contains {text!r}"

"""Python source cut into top-level statements as it streams, so that each can
run as soon as it is complete (partial execution of a Python interpreter tool).

A simple statement is complete at the end of its line once it parses; a compound
one (`def`, `for`, `with`, `if`, ...) only when a later line starts at column 0
and does not continue it (`else`, `elif`, `except`, `finally`), or when the
source ends. Running the statements one after another in one namespace is
running the whole source, for source that parses as a whole.
"""

from __future__ import annotations

import ast
import re

_FIRST_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTINUATIONS = ("else", "elif", "except", "finally")


def _starts_statement(line: str) -> bool:
    """A line at column 0 that can begin a new top-level statement."""
    if not line or line[0] in " \t\r\n#":
        return False
    word = line.split(None, 1)[0].rstrip(":")
    return word not in _CONTINUATIONS


def _begins_statement(partial_line: str) -> bool:
    """Does the line being written surely begin a new top-level statement (its first
    word, if it starts with one, is complete)?"""
    if not partial_line or partial_line[0] in " \t\r#":
        return False
    word = _FIRST_WORD.match(partial_line)
    if word is None:
        return True
    return word.end() < len(partial_line) and word.group() not in _CONTINUATIONS


def _parses(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _ends_open(module: ast.Module) -> bool:
    """Could more lines still belong to the last statement (a compound one)?"""
    if not module.body:
        return False
    last = module.body[-1]
    return any(hasattr(last, body) for body in ("body", "orelse", "handlers", "finalbody", "cases"))


class PythonChunker:
    """Fed source text as it streams; returns the top-level statements it completes."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        """Complete lines not yet returned."""
        self._partial = ""
        """The line being written."""

    def feed(self, text: str) -> list[str]:
        text = self._partial + text
        *complete, self._partial = text.split("\n")
        self._lines += [line + "\n" for line in complete]
        return self._take(final=False)

    def finish(self) -> list[str]:
        """The rest of the source, complete or not (running it reports its error)."""
        if self._partial:
            self._lines.append(self._partial)
            self._partial = ""
        return self._take(final=True)

    def _take(self, final: bool) -> list[str]:
        chunks: list[str] = []
        start = 0
        count = len(self._lines)
        for end in range(1, count + 1):
            if end < count:
                boundary = _starts_statement(self._lines[end])
            else:
                boundary = final or _begins_statement(self._partial)
            if not boundary and end < count:
                continue
            module = _parses("".join(self._lines[start:end]))
            if module is None or not module.body or (not boundary and _ends_open(module)):
                continue
            chunks.append("".join(self._lines[start:end]))
            start = end
        if final and start < count:
            rest = "".join(self._lines[start:])
            if rest.strip():
                chunks.append(rest)
            start = count
        del self._lines[:start]
        return chunks

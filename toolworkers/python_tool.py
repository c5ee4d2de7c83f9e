"""A Python interpreter tool that runs on partial input: each top-level statement
of the `code` argument runs as soon as the model has written it, in one namespace,
so running the script overlaps writing it (Conveyor, arXiv 2406.00059, §4:
the CodeGen tool). It runs inside a tool worker's sandbox like every hosted
tool; its limits are the sandbox's."""

from __future__ import annotations

import ast
import contextlib
import io
from typing import Any

from toolworkers.builtin_tools import ToolError, string_parameter
from toolworkers.partial_input import PartialInput, PieceKind, run_whole
from toolworkers.registry import CostClass, hosted_tool

_ARGUMENT = "code"
_SOURCE_NAME = "<code>"
_MAX_OUTPUT_CHARS = 4000


class _BoundedText(io.StringIO):
    """Printed output, of which the first `limit` characters are kept."""

    def __init__(self, limit: int):
        super().__init__()
        self._limit = limit
        self.overflowed = False

    def write(self, text: str) -> int:
        room = self._limit - self.tell()
        if len(text) > room:
            self.overflowed = True
            super().write(text[: max(room, 0)])
        else:
            super().write(text)
        return len(text)


class PythonSession:
    """Runs a script statement by statement as it is fed; the first error (or an
    exit) stops it, and the statements after it do not run, as in a whole run."""

    def __init__(self, *, max_output_chars: int = _MAX_OUTPUT_CHARS) -> None:
        self._namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self._output = _BoundedText(max_output_chars)
        self._lines_run = 0
        self._stopped_by: str | None = None
        self._exited = False

    def feed(self, statement: str) -> None:
        if self._stopped_by is not None or self._exited:
            return
        first_line = self._lines_run + 1
        self._lines_run += statement.count("\n")
        try:
            tree = ast.parse(statement, _SOURCE_NAME)
        except SyntaxError as error:
            line = first_line + (error.lineno or 1) - 1
            self._stopped_by = f"line {line}: SyntaxError: {error.msg}"
            return
        ast.increment_lineno(tree, first_line - 1)
        code = compile(tree, _SOURCE_NAME, "exec")
        with contextlib.redirect_stdout(self._output):
            try:
                exec(code, self._namespace)
            except SystemExit as stop:
                self._exited = True
                if stop.code not in (None, 0):
                    self._stopped_by = f"the script exited with status {stop.code}"
            except Exception as error:  # the script's own error, for the model to read
                self._stopped_by = f"line {_failing_line(error)}: {type(error).__name__}: {error}"

    def finish(self, arguments: dict[str, Any]) -> str:
        printed = self._output.getvalue()
        if self._output.overflowed:
            printed += f"\n[output cut at {len(printed)} characters]"
        if not isinstance(arguments.get(_ARGUMENT), str):
            raise ToolError(f"`{_ARGUMENT}` must be a string of Python source")
        if self._stopped_by is not None:
            separator = "" if not printed or printed.endswith("\n") else "\n"
            raise ToolError(printed + separator + self._stopped_by)
        return printed or "(the script printed nothing)"


def _failing_line(error: BaseException) -> int | str:
    line: int | str = "?"
    frame = error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename == _SOURCE_NAME:
            line = frame.tb_lineno
        frame = frame.tb_next
    return line


PYTHON_INPUT = PartialInput(
    argument=_ARGUMENT, pieces=PieceKind.PYTHON_STATEMENTS, session=PythonSession
)


@hosted_tool(
    name="python",
    description="Run a Python script and return what it prints (the standard "
    "library only, no network, no files kept between calls).",
    parameters=string_parameter(_ARGUMENT, "The Python script"),
    # Its output may depend on time or randomness: never cached or speculated.
    side_effect_free=False,
    cost_class=CostClass.MODERATE,
    timeout_s=10.0,
    partial_input=PYTHON_INPUT,
)
def python(code: str) -> str:
    return run_whole(PYTHON_INPUT, {"code": code}, {})

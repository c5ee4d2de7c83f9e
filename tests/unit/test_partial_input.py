"""Partial input: a call's stream events to the pieces its tool consumes, and the
Python interpreter tool fed those pieces giving what the whole call gives."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from call_replies import StreamedCall, outcome
from hypothesis import given, settings
from hypothesis import strategies as st

from toolworkers.builtin_tools import ToolError
from toolworkers.call_stream import (
    ArgumentCompleted,
    ArgumentGrowing,
    CallEvent,
)
from toolworkers.partial_input import (
    PartialInput,
    PieceKind,
    PieceSplitter,
    whole_pieces,
)
from toolworkers.python_tool import PYTHON_INPUT, PythonSession, python
from toolworkers.registry import declared_spec

SCRIPTS = [
    "import math\nx = math.sqrt(16)\nprint(x)\n",
    "def square(n):\n    return n * n\n\nprint(square(3))\nprint(square(4))",
    "total = 0\nfor i in range(4):\n    total += i\nelse:\n    total *= 10\nprint(total)\n",
    "try:\n    1 / 0\nexcept ZeroDivisionError:\n    print('caught')\nfinally:\n"
    "    print('done')\nprint('end')\n",
    'text = """\nnot code: for x in\n"""\nprint(len(text), "\\u00e9\\"")\n',
    "print('before')\nundefined_name + 1\nprint('never')\n",
    "print('first')\nif True print('bad')\nprint('never')\n",
    "import sys\nprint('bye')\nsys.exit(0)\nprint('never')\n",
]


def run_streamed(text_pieces: list[str]) -> tuple[bool, str]:
    """The reply streamed through the parser, the splitter and a session."""
    parser = StreamedCall("python")
    splitter = PieceSplitter(PYTHON_INPUT, call_index=0)
    session = PythonSession()
    events: list[CallEvent] = []
    for text in text_pieces:
        for event in parser.feed(text):
            events.append(event)
            for piece in splitter.pieces(event):
                session.feed(piece)
    for event in parser.finish():
        events.append(event)
        for piece in splitter.pieces(event):
            session.feed(piece)
    assert splitter.complete
    arguments = next(e.value for e in events if isinstance(e, ArgumentCompleted))
    return outcome(lambda: session.finish({"code": arguments}))


@pytest.mark.parametrize("script", SCRIPTS)
def test_streamed_character_by_character_the_tool_gives_the_whole_calls_result(
    script: str,
) -> None:
    reply = json.dumps({"code": script})
    assert run_streamed(list(reply)) == outcome(lambda: python(script))


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(SCRIPTS) - 1), data=st.data())
def test_any_split_of_the_stream_gives_the_whole_calls_result(
    index: int, data: st.DataObject
) -> None:
    reply = json.dumps({"code": SCRIPTS[index]})
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=10)))
    pieces = [reply[start:end] for start, end in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    assert run_streamed(pieces) == outcome(lambda: python(SCRIPTS[index]))


def test_a_script_that_runs_cleanly_prints_what_exec_of_the_whole_prints() -> None:
    for script in SCRIPTS[:5]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(script, "<whole>", "exec"), {"__name__": "__main__"})
        assert python(script) == printed.getvalue()


def test_statements_run_while_the_call_is_still_being_decoded() -> None:
    parser = StreamedCall("python")
    splitter = PieceSplitter(PYTHON_INPUT, call_index=0)
    session = PythonSession()
    reply = json.dumps({"code": "print('one')\nprint('two')\n"})
    cut = reply.index("print('two')")
    for event in parser.feed(reply[:cut]):
        for piece in splitter.pieces(event):
            session.feed(piece)
    assert session._output.getvalue() == "one\n"  # before the rest is decoded
    assert not splitter.complete


def test_an_error_names_its_line_and_stops_the_script() -> None:
    with pytest.raises(ToolError) as raised:
        python("x = 1\nprint(x)\ny = x / 0\nprint('never')\n")
    assert str(raised.value) == "1\nline 3: ZeroDivisionError: division by zero"
    with pytest.raises(ToolError, match="line 2: SyntaxError"):
        python("print('ok')\nif True print('bad')\n")
    with pytest.raises(ToolError, match="exited with status 3"):
        python("import sys\nsys.exit(3)\n")


def test_an_error_inside_a_function_names_the_scripts_line() -> None:
    with pytest.raises(ToolError, match=r"^line 2: KeyError: 'k'$"):
        python("def get(d):\n    return d['k']\n\nget({})\n")


def test_output_beyond_the_cap_is_cut_and_said() -> None:
    session = PythonSession(max_output_chars=10)
    session.feed("print('x' * 50)\n")
    finished = session.finish({"code": "print('x' * 50)\n"})
    assert finished == "x" * 10 + "\n[output cut at 10 characters]"


def test_a_script_that_prints_nothing_says_so_and_code_must_be_a_string() -> None:
    assert python("x = 2\n") == "(the script printed nothing)"
    with pytest.raises(ToolError, match="must be a string"):
        python(7)  # type: ignore[arg-type]


def test_the_splitter_takes_only_its_calls_consumed_argument() -> None:
    query = PartialInput(argument="query", pieces=PieceKind.FIELD, session=PythonSession)
    splitter = PieceSplitter(query, call_index=1)
    assert splitter.pieces(ArgumentCompleted(0, "query", "other call")) == []
    assert splitter.pieces(ArgumentCompleted(1, "limit", 5)) == []
    assert splitter.pieces(ArgumentGrowing(1, "query", "kv ca")) == []
    assert splitter.pieces(ArgumentCompleted(1, "query", "kv cache")) == ["kv cache"]
    assert splitter.complete
    assert splitter.pieces(ArgumentCompleted(1, "query", "again")) == []


def test_list_items_are_pieces_and_a_missing_or_mistyped_argument_gives_none() -> None:
    stages = PartialInput(argument="stages", pieces=PieceKind.LIST_ITEMS, session=PythonSession)
    assert whole_pieces(stages, {"stages": ["a", {"b": 1}]}) == ["a", {"b": 1}]
    assert whole_pieces(stages, {"stages": "not a list"}) == []
    assert whole_pieces(stages, {}) == []
    assert whole_pieces(PYTHON_INPUT, {"code": 7}) == []


def test_the_python_tool_declares_its_partial_input() -> None:
    spec = declared_spec(python, "toolworkers.python_tool:python")
    assert spec.partial_input is PYTHON_INPUT
    assert not spec.side_effect_free

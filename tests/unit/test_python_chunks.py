"""Python source cut into runnable top-level statements as it streams."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolworkers.python_chunks import PythonChunker

PROGRAMS = [
    "import math\nx = math.sqrt(16)\nprint(x)\n",
    "def square(n):\n    return n * n\n\nprint(square(3))\n",
    "@staticmethod\ndef tagged():\n    return 1\n\nvalues = [\n    1,\n2,\n]\nprint(sum(values))\n",
    "total = 0\nfor i in range(4):\n    total += i\nelse:\n    total *= 10\nprint(total)\n",
    "try:\n    1 / 0\nexcept ZeroDivisionError:\n    print('caught')\n"
    "finally:\n    print('done')\nprint('end')\n",
    'text = """\nnot code: for x in\n"""\nprint(len(text))\n',
    "if False: print('no')\nelif True: print('yes')\n# a comment\n\nclass Point:\n"
    "    x = 1\n\n    def norm(self):\n        return abs(self.x)\nprint(Point().norm())",
    "s = 'a' \\\n    'b'\nprint(s)\n"
    "with contextlib.suppress(KeyError):\n    {}['k']\nprint('after')\n",
]


def chunks_of(pieces: list[str]) -> list[str]:
    chunker = PythonChunker()
    chunks: list[str] = []
    for piece in pieces:
        chunks += chunker.feed(piece)
    return chunks + chunker.finish()


def run(sources: list[str]) -> tuple[str, dict[str, Any]]:
    namespace: dict[str, Any] = {"contextlib": contextlib}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        for source in sources:
            exec(compile(source, "<tool>", "exec"), namespace)
    namespace.pop("__builtins__", None)
    return output.getvalue(), {k: v for k, v in namespace.items() if isinstance(v, int | str)}


def test_statements_are_returned_as_soon_as_they_are_complete() -> None:
    chunker = PythonChunker()
    assert chunker.feed("x = 1\ny = (") == ["x = 1\n"]
    assert chunker.feed("2,\n 3)\nfor i in y:\n    print(i)\n") == ["y = (2,\n 3)\n"]
    assert chunker.feed("    x += i\n") == []  # the loop's body may go on
    assert chunker.feed("print(x)") == ["for i in y:\n    print(i)\n    x += i\n"]
    assert chunker.finish() == ["print(x)"]


@pytest.mark.parametrize("source", PROGRAMS)
def test_running_the_chunks_is_running_the_whole(source: str) -> None:
    chunks = chunks_of(list(source))
    assert "".join(chunks) == source
    assert len(chunks) > 1
    assert run(chunks) == run([source])


def test_source_that_does_not_parse_comes_back_whole_at_the_end() -> None:
    assert chunks_of(["x = 1\nif x\n    y = 2\n"]) == ["x = 1\n", "if x\n    y = 2\n"]


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, len(PROGRAMS) - 1), data=st.data())
def test_any_split_runs_as_the_whole(index: int, data: st.DataObject) -> None:
    source = PROGRAMS[index]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(source)), max_size=8)))
    pieces = [
        source[start:end] for start, end in zip([0, *cuts], [*cuts, len(source)], strict=True)
    ]
    chunks = chunks_of(pieces)
    assert "".join(chunks) == source
    assert run(chunks) == run([source])

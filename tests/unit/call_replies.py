"""Helpers for tests of tools fed a streamed call: one call streamed as vLLM's
front end streams it (its name, then its arguments' JSON text in the pieces a
test chooses) through the round's parser, and a tool run's outcome as the model
would read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolworkers.builtin_tools import ToolError
from toolworkers.call_stream import CallEvent, ToolCallDeltaParser


class StreamedCall:
    """Call `index` named `name`: each `feed` is one `delta.tool_calls` fragment of
    its arguments' text (the first also names the call)."""

    def __init__(self, name: str, index: int = 0) -> None:
        self._parser = ToolCallDeltaParser()
        self._index = index
        self._name: str | None = name

    def feed(self, arguments_text: str) -> list[CallEvent]:
        function: dict[str, Any] = {"arguments": arguments_text}
        if self._name is not None:
            function["name"], self._name = self._name, None
        return self._parser.feed([{"index": self._index, "id": "call_0", "function": function}])

    def finish(self) -> list[CallEvent]:
        return self._parser.finish()


def outcome(run: Callable[[], str]) -> tuple[bool, str]:
    """(True, the result) or (False, the tool error's message)."""
    try:
        return True, run()
    except ToolError as error:
        return False, str(error)

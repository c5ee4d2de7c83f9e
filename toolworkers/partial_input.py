"""Partial input for hosted tools: what piece of a call's arguments a tool consumes
while the call is still being decoded, and how a call's stream events become
those pieces.

A tool that accepts partial input declares a `PartialInput`: the argument it
consumes, how that argument is cut into pieces, and the session class that runs
them. The session is fed piece by piece (`feed`) and then `finish`ed with the
whole arguments; the tool's whole-call function is the same session fed the
pieces of the finished arguments at once (`run_whole`), so a call executed
partially and the same call executed whole do the same work in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from toolworkers.call_stream import (
    ArgumentCompleted,
    ArgumentGrowing,
    ArgumentItemCompleted,
    CallEvent,
)
from toolworkers.python_chunks import PythonChunker


class PieceKind(StrEnum):
    """How the consumed argument is cut into pieces."""

    FIELD = "field"
    """The argument's whole value, once its JSON value is complete (a search
    query: the search starts before the rest of the call is decoded)."""
    PYTHON_STATEMENTS = "python_statements"
    """A string argument holding Python source, as top-level statements, each as
    soon as it is complete (`toolworkers.python_chunks`)."""
    LIST_ITEMS = "list_items"
    """A list argument's items in order, each a piece as soon as it is complete
    (a plan's stages: the first runs while the next is being decoded)."""


class PartialSession(Protocol):
    """A tool call in progress: pieces in, one result out. Raise
    `toolworkers.builtin_tools.ToolError` for a failure the model should read."""

    def feed(self, piece: Any) -> None: ...

    def finish(self, arguments: dict[str, Any]) -> str: ...


@dataclass(frozen=True)
class PartialInput:
    """What a tool that runs on partial input consumes, and what runs it.
    `session` is called with the tool's configured options."""

    argument: str
    pieces: PieceKind
    session: Callable[..., PartialSession]


class PieceSplitter:
    """One call's stream events to the pieces of its consumed argument, in order;
    the pieces of an argument fed whole are the pieces of it fed in any split."""

    def __init__(self, partial: PartialInput, call_index: int):
        self._partial = partial
        self._call_index = call_index
        self._chunker = PythonChunker() if partial.pieces is PieceKind.PYTHON_STATEMENTS else None
        self._items_fed = 0
        self.complete = False
        """Whether the consumed argument has been decoded in full."""

    def pieces(self, event: CallEvent) -> list[Any]:
        """The pieces `event` completes (none for another call's or argument's)."""
        if (
            self.complete
            or not isinstance(event, (ArgumentGrowing, ArgumentItemCompleted, ArgumentCompleted))
            or event.index != self._call_index
            or event.name != self._partial.argument
        ):
            return []
        if isinstance(event, ArgumentGrowing):
            return self._chunker.feed(event.text) if self._chunker is not None else []
        if isinstance(event, ArgumentItemCompleted):
            streamed_item = self._partial.pieces is PieceKind.LIST_ITEMS
            if not streamed_item or event.position != self._items_fed:
                return []
            self._items_fed += 1
            return [event.value]
        self.complete = True
        return self._last_pieces(event.value)

    def _last_pieces(self, value: Any) -> list[Any]:
        if self._chunker is not None:
            if not isinstance(value, str):
                return []  # not source: the whole call's run reports it
            return self._chunker.finish()
        if self._partial.pieces is PieceKind.LIST_ITEMS:
            return list(value[self._items_fed :]) if isinstance(value, list) else []
        return [value]


def whole_pieces(partial: PartialInput, arguments: dict[str, Any]) -> list[Any]:
    """The pieces of a finished call's consumed argument."""
    splitter = PieceSplitter(partial, call_index=0)
    if partial.argument not in arguments:
        return []
    value = arguments[partial.argument]
    pieces: list[Any] = []
    if partial.pieces is PieceKind.PYTHON_STATEMENTS and isinstance(value, str):
        pieces += splitter.pieces(ArgumentGrowing(0, partial.argument, value))
    return pieces + splitter.pieces(ArgumentCompleted(0, partial.argument, value))


def run_whole(partial: PartialInput, arguments: dict[str, Any], options: dict[str, Any]) -> str:
    """A call of a partial-input tool made whole: its session fed every piece."""
    session = partial.session(**options)
    for piece in whole_pieces(partial, arguments):
        session.feed(piece)
    return session.finish(arguments)

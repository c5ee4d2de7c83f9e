"""Tool calls read off the model's text while it streams: a parser per chat
format, fed text deltas, emitting events as soon as the text decides them (a call
started with its name, an argument field completed, a string argument growing, a
call closed, a call malformed). Each delta is scanned once; nothing is re-parsed
from the start. One parser serves one stream, for every consumer of its events.

The hermes format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) is
read as vLLM's hermes tool parser reads it: a call is the text up to the first
closing tag, or up to the end of the reply when the last call is never closed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class CallStarted:
    index: int
    """The call's position among the reply's calls, from 0."""
    name: str


@dataclass(frozen=True)
class ArgumentCompleted:
    """A top-level argument whose value is decoded in full."""

    index: int
    name: str
    value: Any


@dataclass(frozen=True)
class ArgumentItemCompleted:
    """An item of a top-level list argument, decoded in full (the list itself may
    still be growing)."""

    index: int
    name: str
    position: int
    value: Any


@dataclass(frozen=True)
class ArgumentGrowing:
    """Text appended to a top-level string argument (decoded, escapes resolved)."""

    index: int
    name: str
    text: str


@dataclass(frozen=True)
class CallClosed:
    index: int
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallMalformed:
    """A call that can never be run: its text is not a call object, or is cut off."""

    index: int
    reason: str


CallEvent = (
    CallStarted
    | ArgumentCompleted
    | ArgumentItemCompleted
    | ArgumentGrowing
    | CallClosed
    | CallMalformed
)


class StreamingCallParser(Protocol):
    def feed(self, text: str) -> list[CallEvent]:
        """Events the text decides, given everything fed before."""

    def finish(self) -> list[CallEvent]:
        """Events of the end of the reply (a last call never closed)."""


class JsonSyntaxError(ValueError):
    pass


_Path = tuple[str | int, ...]
_SCALAR_START = frozenset("-0123456789tfn")
_SCALAR_END = frozenset(",}] \t\r\n")
_ESCAPABLE = frozenset('"\\/bfnrtu')
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@dataclass
class _Container:
    kind: str  # "{" or "["
    path: _Path
    start: int
    expect: str  # "key_or_close", "key", "colon", "value", "value_or_close", "comma_or_close"
    key: str | None = None
    items: int = 0


@dataclass
class _Open:
    """A string or scalar being read."""

    start: int
    path: _Path
    is_string: bool
    is_key: bool = False
    escaped: bool = False
    hex_digits_left: int = 0
    decoded_upto: int = 0
    """Raw index up to which a string's growth has been reported."""

    def __post_init__(self) -> None:
        self.decoded_upto = self.start + 1  # past the opening quote


def _child_path(parent: _Container | None) -> _Path:
    if parent is None:
        return ()
    if parent.kind == "{":
        assert parent.key is not None
        return (*parent.path, parent.key)
    return (*parent.path, parent.items)


def _decodable_end(raw: str, start: int, end: int) -> int:
    """The last index <= end at which raw[start:end] can be cut without splitting
    an escape sequence, or a UTF-16 surrogate pair written as two escapes."""
    index = safe = start
    while index < end:
        if raw[index] != "\\":
            index += 1
        elif index + 1 >= end:
            break
        elif raw[index + 1] != "u":
            index += 2
        elif index + 6 > end:
            break
        elif 0xD800 <= int(raw[index + 2 : index + 6], 16) <= 0xDBFF and (
            raw.startswith("\\u", index + 6) or index + 8 > end
        ):
            if index + 12 > end:
                break
            index += 12
        else:
            index += 6
        safe = index
    return safe


class JsonScanner:
    """Reads one JSON value character by character, reporting each value's path
    and text span as it completes and the raw text of string values as it grows."""

    def __init__(
        self,
        on_value: Callable[[_Path, int, int], None],
        on_string: Callable[[_Path, str], None],
        watch_strings: Callable[[_Path], bool],
    ):
        self.text = ""
        self.done = False
        self.error: str | None = None
        self._stack: list[_Container] = []
        self._open: _Open | None = None
        self._on_value = on_value
        self._on_string = on_string
        self._watch_strings = watch_strings

    def feed(self, text: str) -> None:
        start = len(self.text)
        self.text += text
        for position in range(start, len(self.text)):
            if self.error is not None:
                return
            try:
                self._step(position, self.text[position])
            except (JsonSyntaxError, ValueError) as error:
                self.error = str(error)
                return
        self._report_growth()

    def finish(self) -> None:
        """The text ended: a number at the very end is complete."""
        if self.error is None and self._open is not None and not self._open.is_string:
            try:
                self._close_scalar(len(self.text))
            except JsonSyntaxError as error:
                self.error = str(error)

    def _report_growth(self) -> None:
        opened = self._open
        if self.error is None and opened is not None and opened.is_string and not opened.is_key:
            self._grow(opened, _decodable_end(self.text, opened.decoded_upto, len(self.text)))

    def _grow(self, opened: _Open, end: int) -> None:
        """Reports a watched string's text up to `end` (a cut no escape spans)."""
        if end > opened.decoded_upto and self._watch_strings(opened.path):
            self._on_string(
                opened.path, json.loads('"' + self.text[opened.decoded_upto : end] + '"')
            )
            opened.decoded_upto = end

    def _step(self, position: int, char: str) -> None:
        opened = self._open
        if opened is not None:
            if opened.is_string:
                if opened.hex_digits_left:
                    if char not in _HEX_DIGITS:
                        raise JsonSyntaxError(f"invalid \\u escape at {char!r}")
                    opened.hex_digits_left -= 1
                elif opened.escaped:
                    if char not in _ESCAPABLE:
                        raise JsonSyntaxError(f"invalid escape \\{char}")
                    opened.escaped = False
                    opened.hex_digits_left = 4 if char == "u" else 0
                elif char == "\\":
                    opened.escaped = True
                elif char == '"':
                    self._close_string(position)
                elif char < " ":
                    raise JsonSyntaxError("control character in a string")
                return
            if char not in _SCALAR_END:
                return
            self._close_scalar(position)
        if char in " \t\r\n":
            return
        if self.done:
            raise JsonSyntaxError("text after the JSON value")
        top = self._stack[-1] if self._stack else None
        expect = top.expect if top is not None else "value"
        if expect in ("key_or_close", "key"):
            assert top is not None
            if char == '"':
                self._open = _Open(position, top.path, is_string=True, is_key=True)
            elif char == "}" and expect == "key_or_close":
                self._close_container(position)
            else:
                raise JsonSyntaxError(f"expected a key at {char!r}")
        elif expect == "colon":
            assert top is not None
            if char != ":":
                raise JsonSyntaxError(f"expected ':' at {char!r}")
            top.expect = "value"
        elif expect == "comma_or_close":
            assert top is not None
            if char == ",":
                top.expect = "key" if top.kind == "{" else "value"
                top.items += 1
            elif (char, top.kind) in (("}", "{"), ("]", "[")):
                self._close_container(position)
            else:
                raise JsonSyntaxError(f"expected ',' or a closing bracket at {char!r}")
        elif char == "]" and expect == "value_or_close":
            self._close_container(position)
        else:
            self._open_value(position, char, top)

    def _open_value(self, position: int, char: str, parent: _Container | None) -> None:
        path = _child_path(parent)
        if char in "{[":
            expect = "key_or_close" if char == "{" else "value_or_close"
            self._stack.append(_Container(char, path, position, expect))
        elif char == '"':
            self._open = _Open(position, path, is_string=True)
        elif char in _SCALAR_START:
            self._open = _Open(position, path, is_string=False)
        else:
            raise JsonSyntaxError(f"unexpected {char!r}")

    def _close_string(self, position: int) -> None:
        opened = self._open
        assert opened is not None
        self._open = None
        if opened.is_key:
            top = self._stack[-1]
            top.key = json.loads(self.text[opened.start : position + 1])
            top.expect = "colon"
            return
        self._grow(opened, position)
        self._value_done(opened.path, opened.start, position + 1)

    def _close_scalar(self, end: int) -> None:
        opened = self._open
        assert opened is not None
        self._open = None
        try:
            json.loads(self.text[opened.start : end])
        except ValueError as error:
            raise JsonSyntaxError(f"invalid literal {self.text[opened.start : end]!r}") from error
        self._value_done(opened.path, opened.start, end)

    def _close_container(self, position: int) -> None:
        container = self._stack.pop()
        self._value_done(container.path, container.start, position + 1)

    def _value_done(self, path: _Path, start: int, end: int) -> None:
        if self._stack:
            self._stack[-1].expect = "comma_or_close"
        else:
            self.done = True
        self._on_value(path, start, end)


_OPEN_TAG = "<tool_call>"
_CLOSE_TAG = "</tool_call>"


def _tag_prefix_at_end(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


@dataclass
class _ScannedCall:
    """One call's JSON read as it streams: the events of its top-level arguments.
    `_ARGUMENTS` is the path of the arguments object inside the scanned JSON."""

    _ARGUMENTS: ClassVar[_Path] = ()
    index: int
    scanner: JsonScanner = field(init=False)
    name: str | None = None
    """The name under which the call started."""
    held: list[CallEvent] = field(default_factory=list)
    """Argument events decided before the name (emitted once it is known)."""
    events: list[CallEvent] = field(default_factory=list)
    # What the call closes with. Duplicate keys resolve as JSON decoders resolve
    # them: the last one wins.
    fields: dict[str, Any] = field(default_factory=dict)
    """Argument fields decoded since the last arguments object opened."""
    arguments: dict[str, Any] | None = None
    arguments_is_object: bool = True

    def __post_init__(self) -> None:
        self.scanner = JsonScanner(self._on_value, self._on_string, self._is_argument)

    def _is_argument(self, path: _Path) -> bool:
        depth = len(self._ARGUMENTS)
        return (
            len(path) == depth + 1
            and path[:depth] == self._ARGUMENTS
            and isinstance(path[depth], str)
        )

    def _is_argument_item(self, path: _Path) -> bool:
        return self._is_argument(path[:-1]) and isinstance(path[-1], int)

    def _start(self, name: str) -> None:
        self.name = name
        self.events += [CallStarted(self.index, name), *self.held]
        self.held.clear()

    def _emit(self, event: CallEvent) -> None:
        (self.events if self.name is not None else self.held).append(event)

    def _on_value(self, path: _Path, start: int, end: int) -> None:
        text = self.scanner.text
        if path == self._ARGUMENTS:
            self.arguments_is_object = text[start] == "{"
            self.arguments, self.fields = self.fields, {}
        elif self._is_argument(path):
            value = self.fields[str(path[-1])] = json.loads(text[start:end])
            self._emit(ArgumentCompleted(self.index, str(path[-1]), value))
        elif self._is_argument_item(path):
            item = json.loads(text[start:end])
            self._emit(ArgumentItemCompleted(self.index, str(path[-2]), int(path[-1]), item))

    def _on_string(self, path: _Path, text: str) -> None:
        if text:
            self._emit(ArgumentGrowing(self.index, str(path[-1]), text))

    def take(self) -> list[CallEvent]:
        events, self.events = self.events, []
        return events

    def _scanned(self, cut: str) -> CallMalformed | None:
        """Whether the JSON read is whole and valid; `cut`: what ended it early."""
        scanner = self.scanner
        scanner.finish()
        if scanner.error is not None:
            return CallMalformed(self.index, f"not JSON: {scanner.error}")
        if not scanner.done:
            return CallMalformed(self.index, f"{cut} before its JSON did")
        return None


@dataclass
class _HermesCall(_ScannedCall):
    """`{"name": ..., "arguments": {...}}` between the hermes tags."""

    _ARGUMENTS: ClassVar[_Path] = ("arguments",)
    is_object: bool = False
    last_name: Any = None

    def _on_value(self, path: _Path, start: int, end: int) -> None:
        text = self.scanner.text
        if path == ():
            self.is_object = text[start] == "{"
        elif path == ("name",):
            self.last_name = json.loads(text[start:end])
            if isinstance(self.last_name, str) and self.name is None:
                self._start(self.last_name)
        else:
            super()._on_value(path, start, end)

    def close(self, truncated: bool) -> CallEvent:
        malformed = self._scanned("the reply ended" if truncated else "the call closed")
        if malformed is not None:
            return malformed
        if not self.is_object or not isinstance(self.last_name, str):
            return CallMalformed(self.index, "not an object with a string `name`")
        if not self.arguments_is_object:
            return CallMalformed(self.index, "`arguments` is not an object")
        return CallClosed(self.index, self.last_name, self.arguments or {})


class HermesCallParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as many as the
    reply makes, with any text around them."""

    def __init__(self) -> None:
        self._pending = ""
        self._call: _HermesCall | None = None
        self._calls = 0

    def feed(self, text: str) -> list[CallEvent]:
        self._pending += text
        events: list[CallEvent] = []
        while self._pending:
            call = self._call
            if call is None:
                at = self._pending.find(_OPEN_TAG)
                if at < 0:
                    keep = _tag_prefix_at_end(self._pending, _OPEN_TAG)
                    self._pending = self._pending[len(self._pending) - keep :]
                    break
                self._pending = self._pending[at + len(_OPEN_TAG) :]
                self._call = _HermesCall(self._calls)
                self._calls += 1
                continue
            at = self._pending.find(_CLOSE_TAG)
            if at < 0:
                keep = _tag_prefix_at_end(self._pending, _CLOSE_TAG)
                call.scanner.feed(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                events += call.take()
                break
            call.scanner.feed(self._pending[:at])
            self._pending = self._pending[at + len(_CLOSE_TAG) :]
            events += call.take()
            events.append(call.close(truncated=False))
            self._call = None
        return events

    def finish(self) -> list[CallEvent]:
        call = self._call
        if call is None:
            return []
        call.scanner.feed(self._pending)
        self._pending = ""
        self._call = None
        return [*call.take(), call.close(truncated=True)]


@dataclass
class _DeltaCall(_ScannedCall):
    """A call's arguments JSON, as OpenAI-style deltas stream it."""

    closed: bool = False

    def close(self) -> CallEvent:
        self.closed = True
        malformed = self._scanned("the reply ended")
        if malformed is not None:
            return malformed
        if self.name is None:
            return CallMalformed(self.index, "no `name`")
        if not self.arguments_is_object:
            return CallMalformed(self.index, "`arguments` is not an object")
        return CallClosed(self.index, self.name, self.arguments or {})


class ToolCallDeltaParser:
    """The same events from OpenAI-style `delta.tool_calls` fragments (what vLLM's
    front end streams once its own parser has read the model's text): a call by
    its `index`, started by the first fragment naming it, closed as soon as its
    arguments object closes (or, unclosed, at the end of the reply)."""

    def __init__(self) -> None:
        self._calls: dict[int, _DeltaCall] = {}

    def feed(self, fragments: list[dict[str, Any]]) -> list[CallEvent]:
        events: list[CallEvent] = []
        for fragment in fragments:
            index = int(fragment.get("index", 0))
            call = self._calls.setdefault(index, _DeltaCall(index))
            if call.closed:
                continue
            function = fragment.get("function") or {}
            if call.name is None and function.get("name"):
                call._start(str(function["name"]))
            call.scanner.feed(function.get("arguments") or "")
            events += call.take()
            if call.scanner.done or call.scanner.error is not None:
                events.append(call.close())
        return events

    def finish(self) -> list[CallEvent]:
        events: list[CallEvent] = []
        for _index, call in sorted(self._calls.items()):
            if not call.closed:
                events += [*call.take(), call.close()]
        return events


STREAMING_CALL_PARSERS: dict[str, Callable[[], StreamingCallParser]] = {
    "hermes": HermesCallParser,
}


CALL_CLOSING_MARKERS: dict[str, str] = {"hermes": _CLOSE_TAG}
"""The text that ends one call in each chat format's replies."""


def streaming_call_parser(chat_format: str) -> StreamingCallParser:
    """A fresh parser for one stream of the chat format (vLLM's tool-call parser name)."""
    try:
        return STREAMING_CALL_PARSERS[chat_format]()
    except KeyError:
        known = ", ".join(sorted(STREAMING_CALL_PARSERS))
        raise ValueError(
            f"no streaming tool-call parser for {chat_format!r}; known: {known}"
        ) from None

"""Tool calls read off a streamed reply: vLLM's front end streams each call as
OpenAI-style `delta.tool_calls` fragments (the name, then its arguments' JSON text
in pieces); the parser assembles them and emits events as soon as the text decides
them (a call started with its name, an argument field completed, a string argument
growing, a call closed, a call malformed). Each fragment is scanned once; nothing
is re-parsed from the start. One parser serves one streamed round, for every
consumer of its calls and events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster.openai_protocol import ToolCallDeltas


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


@dataclass
class _DeltaCall:
    """One call's arguments JSON read as OpenAI-style deltas stream it: the events
    of its top-level arguments."""

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
    """Argument fields decoded so far."""
    arguments: dict[str, Any] | None = None
    arguments_is_object: bool = True
    closed: bool = False

    def __post_init__(self) -> None:
        self.scanner = JsonScanner(self._on_value, self._on_string, self._is_argument)

    @staticmethod
    def _is_argument(path: _Path) -> bool:
        return len(path) == 1 and isinstance(path[0], str)

    def start(self, name: str) -> None:
        self.name = name
        self.events += [CallStarted(self.index, name), *self.held]
        self.held.clear()

    def _emit(self, event: CallEvent) -> None:
        (self.events if self.name is not None else self.held).append(event)

    def _on_value(self, path: _Path, start: int, end: int) -> None:
        text = self.scanner.text
        if path == ():
            self.arguments_is_object = text[start] == "{"
            self.arguments = self.fields
        elif self._is_argument(path):
            value = self.fields[str(path[0])] = json.loads(text[start:end])
            self._emit(ArgumentCompleted(self.index, str(path[0]), value))
        elif len(path) == 2 and self._is_argument(path[:1]) and isinstance(path[1], int):
            item = json.loads(text[start:end])
            self._emit(ArgumentItemCompleted(self.index, str(path[0]), path[1], item))

    def _on_string(self, path: _Path, text: str) -> None:
        if text:
            self._emit(ArgumentGrowing(self.index, str(path[-1]), text))

    def take(self) -> list[CallEvent]:
        events, self.events = self.events, []
        return events

    def close(self) -> CallEvent:
        self.closed = True
        scanner = self.scanner
        scanner.finish()
        if scanner.error is not None:
            return CallMalformed(self.index, f"not JSON: {scanner.error}")
        if not scanner.done:
            return CallMalformed(self.index, "the reply ended before its JSON did")
        if self.name is None:
            return CallMalformed(self.index, "no `name`")
        if not self.arguments_is_object:
            return CallMalformed(self.index, "`arguments` is not an object")
        return CallClosed(self.index, self.name, self.arguments or {})


class ToolCallDeltaParser:
    """One streamed reply's `delta.tool_calls` fragments (what vLLM's front end
    streams once its own tool parser has read the model's text), read once: the
    calls assembled by their `index`, and, when `scan`, the events: a call started
    by the first fragment naming it, closed as soon as its arguments object closes
    (or, unclosed, at the end of the reply)."""

    def __init__(self, scan: bool = True) -> None:
        self.assembled = ToolCallDeltas()
        self._scan = scan
        self._calls: dict[int, _DeltaCall] = {}

    def feed(self, fragments: list[dict[str, Any]]) -> list[CallEvent]:
        self.assembled.feed(fragments)
        if not self._scan:
            return []
        events: list[CallEvent] = []
        for fragment in fragments:
            index = int(fragment.get("index", 0))
            call = self._calls.setdefault(index, _DeltaCall(index))
            if call.closed:
                continue
            function = fragment.get("function") or {}
            if call.name is None and function.get("name"):
                call.start(str(function["name"]))
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


CALL_CLOSING_MARKERS: dict[str, str] = {"hermes": "</tool_call>"}
"""The text that ends one call in each chat format's replies (vLLM's tool-call
parser names)."""

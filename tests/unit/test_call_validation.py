"""Streaming tool-call validation: a call that can never be valid is rejected at
the event that decides it, a valid one never is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolworkers.call_stream import CallEvent, ToolCallDeltaParser
from toolworkers.call_validation import CallRejected, CallValidator, RejectionKind


def tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [
    tool(
        "book_flight",
        {
            "type": "object",
            "properties": {
                "cabin": {"type": "string", "enum": ["economy", "business"]},
                "code": {"type": "string", "maxLength": 3},
                "seats": {"type": "integer", "minimum": 1},
                "passenger": {"$ref": "#/$defs/passenger"},
            },
            "required": ["cabin", "seats"],
            "additionalProperties": False,
            "$defs": {
                "passenger": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                }
            },
        },
    ),
    tool("search", {"type": "object", "properties": {"query": {"type": "string"}}}),
    tool("broken_schema", {"type": "no-such-type"}),
]


Reply = list[tuple[str, str]]
"""A reply's calls: each tool's name and its arguments' JSON text."""


def judged(reply: Reply) -> list[tuple[CallEvent, CallRejected | None]]:
    """Every event of the reply's calls, streamed as vLLM streams them (the name,
    then the arguments a character at a time), with its verdict."""
    fragments: list[dict[str, Any]] = []
    for index, (name, arguments) in enumerate(reply):
        fragments.append({"index": index, "id": f"call_{index}", "function": {"name": name}})
        fragments += [{"index": index, "function": {"arguments": char}} for char in arguments]
    parser = ToolCallDeltaParser()
    validator = CallValidator(TOOLS)
    events = [event for fragment in fragments for event in parser.feed([fragment])]
    events += parser.finish()
    return [(event, validator.check(event)) for event in events]


def call(name: str, arguments: dict[str, Any]) -> Reply:
    return [(name, json.dumps(arguments))]


def first_rejection(reply: Reply) -> tuple[int, CallRejected] | None:
    """Position of the first rejected event among the reply's events, and the rejection."""
    for position, (_event, verdict) in enumerate(judged(reply)):
        if verdict is not None:
            return position, verdict
    return None


def test_valid_calls_are_never_rejected() -> None:
    reply = call(
        "book_flight",
        {"cabin": "business", "seats": 2, "code": "LH", "passenger": {"name": "Ada"}},
    ) + call("search", {"query": "anything", "extra": 1})
    assert all(verdict is None for _event, verdict in judged(reply))


def test_an_undeclared_tool_is_rejected_when_its_name_is_decoded() -> None:
    found = first_rejection(call("delete_everything", {"path": "/"}))
    assert found is not None
    position, rejection = found
    assert position == 0  # the call's first event: nothing of its arguments was needed
    assert rejection.kind is RejectionKind.UNDECLARED_TOOL
    assert "book_flight" in rejection.reason


@pytest.mark.parametrize(
    ("arguments", "kind", "decided_by"),
    [
        ({"cabin": "first", "seats": 1}, RejectionKind.BAD_ARGUMENT, "f"),
        ({"cabin": "economy", "code": "ABCD", "seats": 1}, RejectionKind.BAD_ARGUMENT, "ABCD"),
        ({"cabin": "economy", "seats": 0, "code": "X"}, RejectionKind.BAD_ARGUMENT, "seats"),
        ({"cabin": "economy", "seats": "2"}, RejectionKind.BAD_ARGUMENT, "seats"),
        ({"cabin": "economy", "meal": "veg", "seats": 1}, RejectionKind.UNKNOWN_ARGUMENT, "meal"),
        ({"passenger": {}, "cabin": "economy"}, RejectionKind.BAD_ARGUMENT, "passenger"),
        ({"cabin": "economy"}, RejectionKind.MISSING_ARGUMENT, "close"),
    ],
)
def test_an_invalid_argument_is_rejected_at_the_event_that_decides_it(
    arguments: dict[str, Any], kind: RejectionKind, decided_by: str
) -> None:
    events = judged(call("book_flight", arguments))
    rejected = [(event, verdict) for event, verdict in events if verdict is not None]
    assert len(rejected) == 1, "a call is rejected once"
    event, verdict = rejected[0]
    assert verdict is not None and verdict.kind is kind
    if decided_by == "close":
        assert type(event).__name__ == "CallClosed"
    elif decided_by in arguments:
        assert getattr(event, "name", None) == decided_by
    else:  # a string argument, rejected while it grows
        assert type(event).__name__ == "ArgumentGrowing"
        assert events.index((event, verdict)) < len(events) - 2


def test_a_malformed_call_is_rejected_and_an_invalid_schema_checks_nothing() -> None:
    found = first_rejection([("search", "[1]")])
    assert found is not None and found[1].kind is RejectionKind.MALFORMED
    assert first_rejection(call("broken_schema", {"anything": [1, 2]})) is None


def test_tools_without_parameters_or_with_odd_entries_are_accepted() -> None:
    validator = CallValidator([{"type": "function", "function": {"name": "ping"}}, "junk"])  # type: ignore[list-item]
    parser = ToolCallDeltaParser()
    events = parser.feed([{"index": 0, "function": {"name": "ping", "arguments": "{}"}}])
    events += parser.finish()
    assert [validator.check(event) for event in events] == [None] * len(events)

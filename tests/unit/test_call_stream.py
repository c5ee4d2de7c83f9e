"""The streamed round's tool-call parser: calls assembled from `delta.tool_calls`
fragments and events as their text decides them, the same events however the
stream is split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.openai_protocol import ModelToolCall
from toolworkers.call_stream import (
    ArgumentCompleted,
    ArgumentGrowing,
    ArgumentItemCompleted,
    CallClosed,
    CallEvent,
    CallMalformed,
    CallStarted,
    ToolCallDeltaParser,
)


def merged(events: list[CallEvent]) -> list[CallEvent]:
    """Consecutive growth of one argument as one event (how much text each event
    carries depends on where the stream was split)."""
    out: list[CallEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (
            isinstance(event, ArgumentGrowing)
            and isinstance(last, ArgumentGrowing)
            and (last.index, last.name) == (event.index, event.name)
        ):
            out[-1] = ArgumentGrowing(event.index, event.name, last.text + event.text)
        else:
            out.append(event)
    return out


def arguments_of(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": text}}


def named(index: int, name: str, text: str = "") -> dict[str, Any]:
    return {"index": index, "id": f"call_{index}", "function": {"name": name, "arguments": text}}


def parse_deltas(batches: list[list[dict[str, Any]]]) -> list[CallEvent]:
    parser = ToolCallDeltaParser()
    events: list[CallEvent] = []
    for batch in batches:
        events += parser.feed(batch)
    return events + parser.finish()


def test_a_call_is_reported_field_by_field_as_it_streams() -> None:
    parser = ToolCallDeltaParser()
    assert parser.feed([named(0, "read_file")]) == [CallStarted(0, "read_file")]
    assert parser.feed([arguments_of(0, '{"path": "src/ma')]) == [
        ArgumentGrowing(0, "path", "src/ma")
    ]
    assert parser.feed([arguments_of(0, 'in.py", "lines": 4')]) == [
        ArgumentGrowing(0, "path", "in.py"),
        ArgumentCompleted(0, "path", "src/main.py"),
    ]
    assert parser.feed([arguments_of(0, "0}")]) == [
        ArgumentCompleted(0, "lines", 40),
        CallClosed(0, "read_file", {"path": "src/main.py", "lines": 40}),
    ]
    assert parser.finish() == []
    assert parser.assembled.calls() == [
        ModelToolCall("call_0", "read_file", '{"path": "src/main.py", "lines": 40}')
    ]


def test_two_calls_in_one_reply() -> None:
    fragments = [named(0, "a", '{"x": [1, {"y": null}]}'), named(1, "b", "{}")]
    assert merged(parse_deltas([fragments])) == [
        CallStarted(0, "a"),
        ArgumentItemCompleted(0, "x", 0, 1),
        ArgumentItemCompleted(0, "x", 1, {"y": None}),
        ArgumentCompleted(0, "x", [1, {"y": None}]),
        CallClosed(0, "a", {"x": [1, {"y": None}]}),
        CallStarted(1, "b"),
        CallClosed(1, "b", {}),
    ]


def test_escapes_unicode_and_surrogate_pairs_grow_decoded() -> None:
    value = 'say "hi"\\n\tnaïve 😀 </tool_call-ish>'
    for ensure_ascii in (True, False):
        text = json.dumps({"text": value}, ensure_ascii=ensure_ascii)
        # every character its own delta
        events = parse_deltas([[named(0, "echo")], *([arguments_of(0, c)] for c in text)])
        grown = "".join(e.text for e in events if isinstance(e, ArgumentGrowing))
        assert grown == value
        assert events[-1] == CallClosed(0, "echo", {"text": value})


def test_arguments_before_the_name_are_reported_once_the_name_is_known() -> None:
    events = parse_deltas([[arguments_of(0, '{"n": ')], [named(0, "f", "1}")]])
    assert events == [
        CallStarted(0, "f"),
        ArgumentCompleted(0, "n", 1),
        CallClosed(0, "f", {"n": 1}),
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"n": }', "not JSON"),
        ('{"n": "a\nb"}', "control character"),
        ("[1]", "not an object"),
        ('{"s": "\\x"}', "invalid escape"),
        ('{"n": tru}', "invalid literal"),
    ],
)
def test_malformed_calls_are_reported_and_the_stream_goes_on(text: str, reason: str) -> None:
    batches = [[named(0, "f")], *([arguments_of(0, c)] for c in text), [named(1, "next", "{}")]]
    events = parse_deltas(batches)
    malformed = [event for event in events if isinstance(event, CallMalformed)]
    assert len(malformed) == 1 and reason in malformed[0].reason and malformed[0].index == 0
    assert events[-1] == CallClosed(1, "next", {})


def test_a_call_cut_off_by_the_end_of_the_reply_is_malformed() -> None:
    assert parse_deltas([[named(0, "f", '{"n": "ab')]]) == [
        CallStarted(0, "f"),
        ArgumentGrowing(0, "n", "ab"),
        CallMalformed(0, "the reply ended before its JSON did"),
    ]


def test_without_scanning_the_calls_are_only_assembled() -> None:
    parser = ToolCallDeltaParser(scan=False)
    assert parser.feed([named(0, "f", '{"n": ')]) == []
    assert parser.feed([arguments_of(0, "1}")]) == []
    assert parser.finish() == []
    assert parser.assembled.calls() == [ModelToolCall("call_0", "f", '{"n": 1}')]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
calls = st.lists(
    st.tuples(st.text(min_size=1, max_size=8), st.dictionaries(st.text(max_size=6), json_values)),
    min_size=1,
    max_size=2,
)


def delta_fragments(
    calls: list[tuple[str, dict[str, Any]]], cuts_of: Any, ensure_ascii: bool = False
) -> list[dict[str, Any]]:
    """OpenAI-style `delta.tool_calls` fragments of the calls: the name first, then
    the arguments' JSON text cut where `cuts_of(text)` says."""
    fragments: list[dict[str, Any]] = []
    for index, (name, arguments) in enumerate(calls):
        text = json.dumps(arguments, ensure_ascii=ensure_ascii)
        cuts = cuts_of(text)
        fragments.append({"index": index, "id": f"call_{index}", "function": {"name": name}})
        fragments += [
            {"index": index, "function": {"arguments": text[start:end]}}
            for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)
        ]
    return fragments


def test_delta_calls_cut_off_or_malformed_are_reported() -> None:
    cut_off = [{"index": 0, "function": {"name": "f", "arguments": '{"a": "b'}}]
    assert parse_deltas([cut_off])[-1] == CallMalformed(0, "the reply ended before its JSON did")
    not_object = [{"index": 0, "function": {"name": "f", "arguments": "[1]"}}]
    assert parse_deltas([not_object])[-1] == CallMalformed(0, "`arguments` is not an object")
    no_name = [{"index": 0, "function": {"arguments": "{}"}}]
    assert parse_deltas([no_name]) == [CallMalformed(0, "no `name`")]
    bad_json = [{"index": 0, "function": {"name": "f", "arguments": '{"a" 1}'}}]
    (malformed,) = [e for e in parse_deltas([bad_json]) if isinstance(e, CallMalformed)]
    assert malformed.reason.startswith("not JSON")


@settings(max_examples=100, deadline=None)
@given(calls=calls, ensure_ascii=st.booleans(), data=st.data())
def test_any_split_of_delta_fragments_gives_the_events_of_the_whole(
    calls: list[tuple[str, dict[str, Any]]], ensure_ascii: bool, data: st.DataObject
) -> None:
    def cuts_of(text: str) -> list[int]:
        return sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))

    fragments = delta_fragments(calls, cuts_of, ensure_ascii)
    events = merged(parse_deltas([[fragment] for fragment in fragments]))
    whole = merged(parse_deltas([delta_fragments(calls, lambda text: [], ensure_ascii)]))
    assert events == whole
    closed = [event for event in whole if isinstance(event, CallClosed)]
    assert [(event.name, event.arguments) for event in closed] == calls
    for index, (_, arguments) in enumerate(calls):
        for key, value in arguments.items():
            if isinstance(value, str) and value:
                assert ArgumentGrowing(index, key, value) in whole

"""The search and plan tools: fed their pieces as a call streams, each gives what the
whole call gives, and each starts work before the call is decoded in full."""

from __future__ import annotations

import json
from typing import Any

import pytest
from call_replies import StreamedCall, outcome
from hypothesis import given, settings
from hypothesis import strategies as st

from toolworkers.builtin_tools import ToolError
from toolworkers.call_stream import (
    ArgumentCompleted,
    ArgumentItemCompleted,
    CallClosed,
    CallEvent,
)
from toolworkers.partial_input import PartialInput, PieceSplitter, whole_pieces
from toolworkers.plan_tool import PLAN_INPUT, PlanSession, run_plan
from toolworkers.registry import declared_spec
from toolworkers.search_tool import SEARCH_INPUT, SearchSession, match_expression, search

SEARCHES: list[dict[str, Any]] = [
    {"query": "for loop else clause"},
    {"query": "with statement context manager", "max_results": 5},
    {"query": 'généralement "quoted" AND (NOT) yield', "max_results": 1},
    {"query": "zzzz qqqq"},
    {"query": "   "},
    {"query": "lambda", "max_results": 0},
    {"query": 7},
]


def stage(tool: Any, text: Any) -> dict[str, Any]:
    return {"tool": tool, "input": text}


PLANS: list[dict[str, Any]] = [
    {"stages": [stage("calculator", "(2 + 3) * 4"), stage("search", "try finally")]},
    {"stages": [stage("calculator", "1 / 0"), stage("calculator", "2 ** 10")]},
    {"stages": [stage("shell", "ls"), "not a stage", stage("search", 3)]},
    {"stages": [stage("calculator", f"{n} + 1") for n in range(17)]},
    {"stages": []},
    {"stages": "calculator 1 + 1"},
]


def run_streamed(partial: PartialInput, name: str, text_pieces: list[str]) -> tuple[bool, str]:
    """The call's arguments streamed through the parser, the splitter and a session."""
    parser = StreamedCall(name)
    splitter = PieceSplitter(partial, call_index=0)
    session = partial.session()
    events: list[CallEvent] = []
    for text in [*text_pieces, None]:
        for event in parser.feed(text) if text is not None else parser.finish():
            events.append(event)
            for piece in splitter.pieces(event):
                session.feed(piece)
    closed = next(e for e in events if isinstance(e, CallClosed))
    return outcome(lambda: session.finish(closed.arguments))


def splits(data: st.DataObject, reply: str) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=8)))
    return [reply[start:end] for start, end in zip([0, *cuts], [*cuts, len(reply)], strict=True)]


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(SEARCHES) - 1), data=st.data())
def test_a_search_streamed_in_any_split_gives_the_whole_calls_result(
    index: int, data: st.DataObject
) -> None:
    arguments = SEARCHES[index]
    reply = json.dumps(arguments)
    assert run_streamed(SEARCH_INPUT, "search", splits(data, reply)) == outcome(
        lambda: search(**arguments)
    )


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(PLANS) - 1), data=st.data())
def test_a_plan_streamed_in_any_split_gives_the_whole_calls_result(
    index: int, data: st.DataObject
) -> None:
    arguments = PLANS[index]
    reply = json.dumps(arguments)
    assert run_streamed(PLAN_INPUT, "run_plan", splits(data, reply)) == outcome(
        lambda: run_plan(**arguments)
    )


def test_the_search_runs_once_the_query_closes_before_the_rest_is_decoded() -> None:
    parser = StreamedCall("search")
    splitter = PieceSplitter(SEARCH_INPUT, call_index=0)
    session = SearchSession()
    reply = json.dumps({"query": "while loop", "max_results": 2})
    for event in parser.feed(reply[: reply.index('"max_results"')]):
        for piece in splitter.pieces(event):
            session.feed(piece)
    assert session._hits is not None and session._hits[0][0] == "while"
    assert splitter.complete


def test_search_finds_the_topic_and_bounds_its_results() -> None:
    found = search("for loop else clause")
    assert found.startswith("1. for: ")
    assert found.count("\n\n") == 2  # three results by default
    assert search("with statement context manager", max_results=1).startswith("1. with: ")
    assert search("zzzz qqqq") == "No topic of the Python reference matches 'zzzz qqqq'."
    with pytest.raises(ToolError, match="no words"):
        search("  ?! ")
    with pytest.raises(ToolError, match="between 1 and 10"):
        search("lambda", max_results=11)


def test_a_query_is_words_not_fts_syntax() -> None:
    assert match_expression('a "b" AND (NOT c*)') == '"a" OR "b" OR "AND" OR "NOT" OR "c"'


def test_each_plan_stage_runs_when_its_object_closes() -> None:
    parser = StreamedCall("run_plan")
    splitter = PieceSplitter(PLAN_INPUT, call_index=0)
    session = PlanSession()
    reply = json.dumps({"stages": [stage("calculator", "6 * 7"), stage("search", "yield")]})
    events = parser.feed(reply[: reply.index('{"tool": "search"')])
    assert [e for e in events if isinstance(e, ArgumentItemCompleted)] == [
        ArgumentItemCompleted(0, "stages", 0, {"tool": "calculator", "input": "6 * 7"})
    ]
    for event in events:
        for piece in splitter.pieces(event):
            session.feed(piece)
    assert session._outcomes == ["Stage 1 (calculator '6 * 7'):\n42"]
    assert not splitter.complete


def test_a_failing_stage_is_reported_and_the_plan_goes_on() -> None:
    result = run_plan([stage("calculator", "1 / 0"), stage("calculator", "2 + 2")])
    assert result == (
        "Stage 1 (calculator '1 / 0'):\nerror: division by zero\n\nStage 2 (calculator '2 + 2'):\n4"
    )
    with pytest.raises(ToolError, match="at most 16 stages"):
        run_plan([stage("calculator", "1")] * 17)
    with pytest.raises(ToolError, match="no stages"):
        run_plan([])


def test_list_items_are_fed_once_whether_streamed_or_completed_whole() -> None:
    splitter = PieceSplitter(PLAN_INPUT, call_index=0)
    assert splitter.pieces(ArgumentItemCompleted(0, "stages", 0, "a")) == ["a"]
    assert splitter.pieces(ArgumentItemCompleted(1, "stages", 0, "other call")) == []
    assert splitter.pieces(ArgumentCompleted(0, "stages", ["a", "b"])) == ["b"]
    assert splitter.complete
    assert whole_pieces(PLAN_INPUT, {"stages": ["a", "b"]}) == ["a", "b"]


def test_a_repeated_key_is_read_as_json_decoders_read_it_the_last_one_wins() -> None:
    first, last = [stage("calculator", "1 + 1")], [stage("calculator", "2 * 3")]
    reply = '{"stages": ' + json.dumps(first) + ', "stages": ' + json.dumps(last) + "}"
    assert run_streamed(PLAN_INPUT, "run_plan", list(reply)) == (True, run_plan(last))
    search_reply = '{"query": "lambda", "query": "yield"}'
    assert run_streamed(SEARCH_INPUT, "search", [search_reply]) == (True, search("yield"))


def test_nested_items_are_not_top_level_items() -> None:
    parser = StreamedCall("f")
    events = parser.feed(json.dumps({"grid": [[1, 2], [3]], "tags": {"k": [4]}}))
    items = [e for e in events if isinstance(e, ArgumentItemCompleted)]
    assert items == [
        ArgumentItemCompleted(0, "grid", 0, [1, 2]),
        ArgumentItemCompleted(0, "grid", 1, [3]),
    ]


@pytest.mark.parametrize(
    ("function", "reference", "partial"),
    [
        (search, "toolworkers.search_tool:search", SEARCH_INPUT),
        (run_plan, "toolworkers.plan_tool:run_plan", PLAN_INPUT),
    ],
)
def test_the_tools_declare_their_partial_input_and_are_side_effect_free(
    function: Any, reference: str, partial: PartialInput
) -> None:
    spec = declared_spec(function, reference)
    assert spec.partial_input is partial
    assert spec.side_effect_free

"""The learned tool-call predictor: transitions and argument templates."""

from __future__ import annotations

from typing import Any

from toolworkers.predictor import (
    ObservedCall,
    TransitionPredictor,
    calls_in_history,
    latest_user_text,
    shape_of,
)


def _call(name: str, **arguments: Any) -> ObservedCall:
    return ObservedCall(name, arguments)


def test_calls_are_read_from_assistant_messages_in_order() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "1", "function": {"name": "list_files", "arguments": '{"directory": "."}'}},
                {"id": "2", "function": {"name": "broken", "arguments": "{oops"}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "a.txt"},
        {"role": "assistant", "tool_calls": [{"id": "3", "function": {"name": "read_file"}}]},
        {"role": "tool", "tool_call_id": "3", "content": "..."},
    ]
    assert calls_in_history(messages) == [_call("list_files", directory="."), _call("read_file")]


def test_a_repeated_workflow_is_predicted_with_constant_and_copied_arguments() -> None:
    predictor = TransitionPredictor(min_support=2, min_confidence=0.5)
    for ticket in ("T-1", "T-2", "T-3"):
        first = _call("fetch_ticket", id=ticket, verbose=False)
        predictor.observe("triage", None, _call("list_tickets", status="open"))
        predictor.observe("triage", _call("list_tickets", status="open"), first)
        predictor.observe("triage", first, _call("ticket_history", ticket=ticket, limit=5))
    (start,) = predictor.predict("triage", None)
    assert (start.name, start.arguments, start.confidence) == (
        "list_tickets",
        {"status": "open"},
        1.0,
    )
    (history,) = predictor.predict("triage", _call("fetch_ticket", id="T-9", verbose=False))
    assert history.name == "ticket_history"
    assert history.arguments == {"ticket": "T-9", "limit": 5}, "copied from the new previous call"
    assert history.source == "learned"
    assert predictor.predict("other-agent", None) == []


def test_no_prediction_below_support_or_confidence() -> None:
    predictor = TransitionPredictor(min_support=2, min_confidence=0.6)
    predictor.observe("a", None, _call("search", query="x"))
    assert predictor.predict("a", None) == [], "seen once: not enough support"
    predictor.observe("a", None, _call("search", query="x"))
    predictor.observe("a", None, _call("open", path="p"))
    predictor.observe("a", None, _call("open", path="p"))
    assert predictor.predict("a", None) == [], "two tools at 50% each: below 60%"
    predictor.observe("a", None, _call("open", path="p"))
    (prediction,) = predictor.predict("a", None, limit=2)
    assert prediction.name == "open" and prediction.confidence == 0.6


def test_arguments_without_a_stable_source_make_no_prediction() -> None:
    predictor = TransitionPredictor(min_support=2, min_confidence=0.5)
    for query in ("alpha", "beta", "gamma"):
        predictor.observe("a", _call("start"), _call("search", query=query))
    assert predictor.predict("a", _call("start")) == []


def test_optional_arguments_mostly_left_out_are_not_predicted() -> None:
    predictor = TransitionPredictor(min_support=2, min_confidence=0.3)
    predictor.observe("a", None, _call("ls", path="."))
    predictor.observe("a", None, _call("ls", path="."))
    predictor.observe("a", None, _call("ls", path=".", all=True))
    (prediction,) = predictor.predict("a", None)
    assert prediction.arguments == {"path": "."}


def test_memory_is_bounded_by_agent_kinds() -> None:
    predictor = TransitionPredictor(min_support=1, max_agents=2)
    for agent in ("a", "b", "c"):
        predictor.observe(agent, None, _call("t"))
    assert predictor.predict("a", None) == []
    assert [p.name for p in predictor.predict("c", None)] == ["t"]


def test_arguments_are_taken_from_the_user_message_by_shape() -> None:
    predictor = TransitionPredictor(min_support=2, min_confidence=0.5)
    for key in ("INC-1001", "INC-2002", "INC-3003"):
        user = f"Please check {key} and summarize it."
        predictor.observe("records", None, _call("lookup_record", key=key), user)
    (prediction,) = predictor.predict(
        "records", None, user_text="Summarize INC-4242 for me, 2 lines."
    )
    assert prediction.arguments == {"key": "INC-4242"}
    assert predictor.predict("records", None, user_text="Summarize the latest incident.") == []


def test_shapes_and_user_text() -> None:
    assert shape_of("INC-2041") == "A-9"
    assert shape_of("src/app.py") == "a/a.a"
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "tool", "tool_call_id": "1", "content": "x"},
    ]
    assert latest_user_text(messages) == "second"
    assert latest_user_text([]) == ""

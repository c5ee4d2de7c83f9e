"""Speculation policy, draft requests and replies, settlement, and time saved."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.config import HostedToolConfig, SpeculationConfig, ToolsConfig
from cluster.openai_protocol import ModelToolCall
from toolworkers.execution import ResultSource, ToolOutcome
from toolworkers.metrics import time_saved_s
from toolworkers.predictor import ObservedCall, PredictedCall
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import ToolResult
from toolworkers.speculation import (
    DraftSkip,
    DraftWorth,
    SpeculationPolicy,
    draft_predictions,
    draft_request,
    observed_calls,
    reply_calls,
    settle,
)

REGISTRY = ToolRegistry.from_config(
    ToolsConfig(
        hosted=[
            HostedToolConfig(function="toolworkers.hosted_tools:calculator"),
            HostedToolConfig(function="toolworkers.hosted_tools:read_file", options={"root": "."}),
            HostedToolConfig(
                function="toolworkers.hosted_tools:search_files", options={"root": "."}
            ),
            HostedToolConfig(
                function="tool_cache_probes:append_line",
                options={"ledger": "/dev/null"},
            ),
        ]
    )
)
DECLARED = {"calculator", "read_file", "search_files", "append_line"}
BODY: dict[str, Any] = {
    "model": "main",
    "messages": [{"role": "user", "content": "6*7?"}],
    "tools": REGISTRY.openai_schemas(),
    "structured_outputs": {"regex": "x"},
}


def _predicted(name: str, confidence: float = 1.0, **arguments: Any) -> PredictedCall:
    return PredictedCall(name, arguments, confidence, "learned")


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_draft_is_asked_for_lambda_calls_without_prose() -> None:
    one = draft_request(BODY, "draft", SpeculationConfig())
    assert one is not None
    assert one["model"] == "draft" and one["n"] == 1 and one["temperature"] == 0.0
    assert one["tool_choice"] == "required" and not one["stream"]
    assert "structured_outputs" not in one
    named = {"type": "function", "function": {"name": "calculator"}}
    three = draft_request(
        BODY | {"tool_choice": named}, "draft", SpeculationConfig(draft_predictions=3)
    )
    assert three is not None
    assert three["n"] == 3 and three["temperature"] == 0.8 and three["tool_choice"] == named
    assert draft_request(BODY | {"tool_choice": "none"}, "draft", SpeculationConfig()) is None
    assert draft_request(BODY, "draft", SpeculationConfig(draft_predictions=0)) is None
    assert draft_request(BODY | {"tools": []}, "draft", SpeculationConfig()) is None


def test_draft_samples_become_predictions_with_agreement_as_confidence() -> None:
    reply = {
        "choices": [
            {"message": {"tool_calls": [_tool_call("calculator", '{"expression": "6*7"}')]}},
            {"message": {"tool_calls": [_tool_call("calculator", '{ "expression":"6*7" }')]}},
            {"message": {"tool_calls": [_tool_call("read_file", '{"path": "a"}')]}},
            {"message": {"content": "no call"}},
        ]
    }
    predictions = {(p.name, json.dumps(p.arguments)): p for p in draft_predictions(reply)}
    assert predictions[("calculator", '{"expression": "6*7"}')].confidence == 0.5
    assert predictions[("read_file", '{"path": "a"}')].confidence == 0.25
    assert all(p.source == "draft" for p in predictions.values())


def test_policy_runs_only_declared_side_effect_free_tools_confident_enough() -> None:
    policy = SpeculationPolicy(SpeculationConfig(moderate_min_confidence=0.5), REGISTRY)
    chosen = policy.choose(
        [
            _predicted("calculator", 0.1, expression="1+1"),
            _predicted("calculator", 0.9, expression="1+1"),
            _predicted("append_line", 1.0, text="x"),
            _predicted("get_weather", 1.0, city="Paris"),
            _predicted("search_files", 0.4, text="todo"),
            _predicted("search_files", 0.6, text="bug"),
            _predicted("read_file", 0.2, path="a"),
        ],
        DECLARED,
    )
    assert [(p.name, p.arguments, p.confidence) for p in chosen] == [
        ("calculator", {"expression": "1+1"}, 0.9),
        ("search_files", {"text": "bug"}, 0.6),
        ("read_file", {"path": "a"}, 0.2),
    ]
    assert policy.choose([_predicted("calculator", expression="1")], {"read_file"}) == []


def test_of_a_stateful_tool_set_only_the_functions_that_read_the_state_are_speculated() -> None:
    registry = ToolRegistry.from_config(
        ToolsConfig(hosted=[HostedToolConfig(function="toolworkers.bfcl_tools:GorillaFileSystem")])
    )
    policy = SpeculationPolicy(SpeculationConfig(), registry)
    predictions = [
        _predicted("ls", 0.9),
        _predicted("cat", 0.8, file_name="a.txt"),
        _predicted("cd", 1.0, folder="src"),
        _predicted("touch", 1.0, file_name="b.txt"),
    ]
    chosen = policy.choose(predictions, {"ls", "cat", "cd", "touch"})
    assert [p.name for p in chosen] == ["ls", "cat"]


def test_the_draft_is_asked_always_or_only_when_nothing_learned_was_started() -> None:
    learned = [_predicted("calculator", expression="1+1")]
    worth = DraftWorth(min_run_ratio=1.0)
    always = SpeculationPolicy(SpeculationConfig(), REGISTRY)
    assert always.draft_skip(learned, DECLARED, worth) is None
    assert always.draft_skip([], DECLARED, worth) is None
    fallback = SpeculationPolicy(SpeculationConfig(draft_when="no_learned_prediction"), REGISTRY)
    assert fallback.draft_skip(learned, DECLARED, worth) is DraftSkip.LEARNED_PREDICTION
    assert fallback.draft_skip([], DECLARED, worth) is None


def test_the_draft_is_not_asked_for_tools_that_run_shorter_than_it_answers() -> None:
    policy = SpeculationPolicy(SpeculationConfig(), REGISTRY)
    worth = DraftWorth(min_run_ratio=1.0, remembered=3)
    # Neither figure known yet: the draft may be worth it.
    assert policy.draft_skip([], {"calculator"}, worth) is None
    worth.tool_ran("calculator", 0.2)
    assert policy.draft_skip([], {"calculator"}, worth) is None, "the draft never answered yet"
    worth.draft_answered(1.5)
    assert policy.draft_skip([], {"calculator"}, worth) is DraftSkip.SHORT_TOOLS
    # One declared tool that runs long enough (or has not run) is enough to ask.
    assert policy.draft_skip([], {"calculator", "read_file"}, worth) is None
    worth.tool_ran("read_file", 2.0)
    assert policy.draft_skip([], {"calculator", "read_file"}, worth) is None
    worth.tool_ran("read_file", 0.1)
    worth.tool_ran("read_file", 0.1)
    assert policy.draft_skip([], {"calculator", "read_file"}, worth) is DraftSkip.SHORT_TOOLS
    # A faster draft makes the same tools worth it again.
    for _ in range(3):
        worth.draft_answered(0.05)
    assert policy.draft_skip([], {"calculator"}, worth) is None
    # Tools with side effects never run on a guess: nothing to draft them for.
    slow_draft = DraftWorth(min_run_ratio=1.0)
    slow_draft.draft_answered(10.0)
    slow_draft.tool_ran("calculator", 0.2)
    assert policy.draft_skip([], {"calculator", "append_line"}, slow_draft) is DraftSkip.SHORT_TOOLS


def test_a_ratio_of_zero_asks_the_draft_for_every_turn() -> None:
    policy = SpeculationPolicy(SpeculationConfig(), REGISTRY)
    worth = DraftWorth(min_run_ratio=0.0)
    worth.tool_ran("calculator", 0.001)
    worth.draft_answered(30.0)
    assert policy.draft_skip([], {"calculator"}, worth) is None


def test_typical_durations_are_the_median_of_the_last_ones() -> None:
    worth = DraftWorth(min_run_ratio=1.0, remembered=2)
    assert worth.typical_run("search") is None and worth.typical_answer() is None
    for duration in (3.0, 0.2, 0.4):
        worth.tool_ran("search", duration)
    assert worth.typical_run("search") == pytest.approx(0.3)
    for duration in (0.5, 9.0, 1.0):
        worth.draft_answered(duration)
    assert worth.typical_answer() == pytest.approx(5.0)


def test_settlement_matches_calls_canonically() -> None:
    issued = [_predicted("calculator", expression="6*7"), _predicted("read_file", path="a")]
    made = [ObservedCall("calculator", {"expression": "6*7"})]
    settlement = settle(issued, made)
    assert settlement.used == issued[:1] and settlement.wasted == issued[1:]


def test_a_replys_calls_include_those_the_server_ran() -> None:
    reply = {
        "choices": [{"message": {"tool_calls": [_tool_call("read_file", '{"path": "b"}')]}}],
        "toolserve": {
            "executed_messages": [
                {
                    "role": "assistant",
                    "tool_calls": [_tool_call("calculator", '{"expression": "1"}')],
                },
                {"role": "tool", "tool_call_id": "c", "content": "1"},
            ]
        },
    }
    assert reply_calls(reply) == [
        ObservedCall("calculator", {"expression": "1"}),
        ObservedCall("read_file", {"path": "b"}),
    ]


def test_calls_a_stream_made_are_seen_as_the_predictor_sees_them() -> None:
    made = [
        ModelToolCall("c1", "calculator", '{"expression": "1"}'),
        ModelToolCall("c2", "read_file", '{"path": "c"}'),
        ModelToolCall("c3", "read_file", '{"path": '),  # cut off: not a call
    ]
    assert observed_calls(made) == [
        ObservedCall("calculator", {"expression": "1"}),
        ObservedCall("read_file", {"path": "c"}),
    ]


def test_time_saved_counts_only_real_calls_served_by_someone_elses_run() -> None:
    result = ToolResult(True, "42", None, duration_s=2.0)
    awaited = ToolOutcome(result, ResultSource.AWAITED, "speculation:draft", waited_s=0.5)
    assert time_saved_s(awaited, "") == 1.5
    cached = ToolOutcome(result, ResultSource.CACHED, "speculation:learned", waited_s=0.01)
    assert time_saved_s(cached, "") == 1.99
    assert time_saved_s(cached, "speculation:draft") is None, "a speculation saves no one time"
    assert time_saved_s(ToolOutcome(result, ResultSource.RAN, "", 2.0), "") is None
    assert time_saved_s(ToolOutcome(result, ResultSource.CACHED, "", 0.0), "") is None

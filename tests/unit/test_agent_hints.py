"""Agent hints in each dialect: example requests written after each project's
documentation, read into one form; malformed hints are a 400."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from cluster.openai_protocol import EXPECTED_TOOL_ARG, LAST_STEP_ARG, RETAIN_FOR_ARG
from deployments.api.agent_hints import (
    AgentHints,
    parse_sglang_close,
    parse_sglang_open,
    read_agent_hints,
)
from deployments.api.parsing import apply_agent_hints, parse_chat_body, program_id_for
from deployments.errors import RequestRejected

MODELS = ["m"]


def _read(body: dict[str, Any], headers: dict[str, str] | None = None) -> AgentHints:
    return read_agent_hints(body, headers or {})


def test_dynamo_agent_hints_give_a_priority_in_vllms_order_and_leave_the_body() -> None:
    body = {
        "messages": [],
        "nvext": {
            "agent_hints": {"priority": 5, "osl": 1024, "speculative_prefill": True},
            "extra_fields": ["worker_id"],
        },
    }
    hints = _read(body)
    assert hints == AgentHints(priority=-5, given=("dynamo.priority",))
    assert body == {"messages": []}
    assert _read({"nvext": {"agent_hints": {"latency_sensitivity": 2.0}}}).priority == -2


def test_dynamo_session_control_names_the_program_and_close_ends_it() -> None:
    opened = _read({"nvext": {"session_control": {"session_id": "sub-1", "action": "open"}}})
    assert (opened.session_id, opened.last_turn) == ("sub-1", False)
    closed = _read({"nvext": {"session_control": {"session_id": "sub-1", "action": "close"}}})
    assert (closed.session_id, closed.last_turn) == ("sub-1", True)
    by_header = _read({}, {"x-dynamo-session-id": "s-9", "x-dynamo-session-final": "true"})
    assert (by_header.session_id, by_header.last_turn) == ("s-9", True)


def test_sglang_session_params_and_retention() -> None:
    hints = _read({"session_params": {"id": "sub-1", "rid": None}, "retention_seconds": 120})
    assert (hints.session_id, hints.retain_for_s) == ("sub-1", 120.0)
    assert _read({"retention_seconds": 0}).retain_for_s == math.inf
    proposed = _read({"agent_hints": {"expected_tool_duration_ms": 2500, "reuse_hint": "keep"}})
    assert (proposed.expected_tool_s, proposed.given) == (2.5, ("sglang.expected_tool_s",))
    assert _read({"agent_hints": {"cache_ttl_ms": 90_000}}).retain_for_s == 90.0


def test_vllm_agent_hint_retention_and_eviction() -> None:
    hints = _read(
        {
            "agent_hint": {
                "session_id": "worker-7",
                "parent_session_id": "orchestrator-1",
                "cache_control": {"type": "ephemeral", "ttl": 300},
            }
        }
    )
    assert (hints.session_id, hints.retain_for_s, hints.last_turn) == ("worker-7", 300.0, False)
    evicted = _read({"agent_hint": {"context_management": {"edits": [{"type": "evict"}]}}})
    assert evicted.last_turn
    partly = {"edits": [{"type": "evict", "block_start": 2, "block_end": 4}]}
    assert not _read({"agent_hint": {"context_management": partly}}).last_turn


def test_the_toolserve_options_come_first_and_unknown_fields_are_ignored() -> None:
    hints = read_agent_hints(
        {"retention_seconds": 5, "nvext": {"agent_hints": {"priority": 1, "future": 3}}},
        {},
        retain_for_s=60.0,
    )
    assert hints.retain_for_s == 60.0
    assert hints.given == ("toolserve.retain_for_s", "dynamo.priority")


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"nvext": {"agent_hints": {"priority": "high"}}}, {}, "nvext.agent_hints.priority"),
        ({"nvext": {"session_control": {"action": "open"}}}, {}, "nvext.session_control"),
        ({"nvext": {"session_control": {"session_id": "a", "action": "fork"}}}, {}, None),
        ({"nvext": "hints"}, {}, "nvext"),
        ({"retention_seconds": -1}, {}, "retention_seconds"),
        ({"retention_seconds": True}, {}, "retention_seconds"),
        ({"agent_hints": {"cache_ttl_ms": -5}}, {}, "agent_hints.cache_ttl_ms"),
        ({"agent_hint": {"cache_control": {"type": "forever"}}}, {}, None),
        ({}, {"x-dynamo-session-final": "maybe"}, "x-dynamo-session-final"),
        ({"session_params": {"id": "a"}, "agent_hint": {"session_id": "b"}}, {}, "session_id"),
    ],
)
def test_malformed_or_contradicting_hints_are_a_400(
    body: dict[str, Any], headers: dict[str, str], param: str | None
) -> None:
    with pytest.raises(RequestRejected) as rejected:
        _read(body, headers)
    assert rejected.value.error.status == 400
    if param is not None:
        assert rejected.value.error.param is not None
        assert rejected.value.error.param.startswith(param)


def test_a_hinted_session_id_names_the_program_unless_another_one_disagrees() -> None:
    assert program_id_for(None, {}, hinted="sub-1") == "sub-1"
    assert program_id_for("sub-1", {"session_id": "sub-1"}, hinted="sub-1") == "sub-1"
    with pytest.raises(RequestRejected):
        program_id_for("sub-1", {}, hinted="sub-2")


def test_a_chat_body_with_hints_reaches_the_engine_as_its_arguments() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "toolserve": {"expected_tool_s": 3.5},
        "agent_hint": {"cache_control": {"ttl": 40}},
        "nvext": {
            "agent_hints": {"priority": 2},
            "session_control": {"session_id": "p", "action": "close"},
        },
    }
    parsed = parse_chat_body(json.dumps(body).encode(), MODELS)
    assert "nvext" not in parsed.body and "agent_hint" not in parsed.body
    apply_agent_hints(parsed.request, parsed.hints)
    assert parsed.request.vllm_xargs == {
        LAST_STEP_ARG: 1,
        RETAIN_FOR_ARG: 40.0,
        EXPECTED_TOOL_ARG: 3.5,
    }
    assert parsed.request.priority == -2
    unordered = parse_chat_body(json.dumps(body).encode(), MODELS)
    apply_agent_hints(unordered.request, unordered.hints, schedules_by_priority=False)
    assert unordered.request.priority == 0
    own_priority = dict(body, priority=1)
    parsed = parse_chat_body(json.dumps(own_priority).encode(), MODELS)
    apply_agent_hints(parsed.request, parsed.hints)
    assert parsed.request.priority == 1


def test_sglangs_session_bodies() -> None:
    opening = {"capacity_of_str_len": 65536, "session_id": "sub-1", "streaming": True}
    assert parse_sglang_open(json.dumps(opening).encode()) == "sub-1"
    assert parse_sglang_open(b'{"capacity_of_str_len": 1024}') is None
    assert parse_sglang_close(b'{"session_id": "sub-1"}') == "sub-1"
    for raw, parse in [
        (b"{}", parse_sglang_close),
        (b"[1]", parse_sglang_open),
        (b"{", parse_sglang_open),
    ]:
        with pytest.raises(RequestRejected) as rejected:
            parse(raw)
        assert rejected.value.error.status == 400

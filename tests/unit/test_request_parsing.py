"""Request validation and program ids, without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deployments.api.health import health_report
from deployments.api.parsing import parse_chat_body, program_id_for
from deployments.errors import ApiError, RequestRejected

MODELS = ["smollm2-135m"]


def _rejection(body: Any) -> ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestRejected) as raised:
        parse_chat_body(raw, MODELS)
    return raised.value.error


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODELS[0], "messages": [{"role": "user", "content": "hi"}]} | fields


def test_a_valid_body_passes_unchanged_and_validated_once() -> None:
    body = _chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto")
    parsed = parse_chat_body(json.dumps(body).encode(), MODELS)
    assert parsed.body == body
    assert parsed.request.model == MODELS[0] and parsed.request.tool_choice == "auto"
    assert [tool.function.name for tool in parsed.request.tools or []] == ["f"]
    assert parsed.options.execute_tools


def test_toolserve_options_are_taken_out_before_validation() -> None:
    body = _chat(toolserve={"execute_tools": False})
    parsed = parse_chat_body(json.dumps(body).encode(), MODELS)
    assert parsed.options.execute_tools is False
    assert "toolserve" not in parsed.body and not (parsed.request.model_extra or {})


def test_model_may_be_omitted() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat_body(json.dumps(body).encode(), MODELS).body == body


@pytest.mark.parametrize(
    ("body", "status", "code", "fragment"),
    [
        (b"{not json", 400, "invalid_request", "not valid JSON"),
        (b"\xff\xfe", 400, "invalid_request", "not valid JSON"),
        ([1], 400, "invalid_request", "JSON object"),
        (_chat(model="gpt-9"), 404, "model_not_found", "gpt-9"),
        (_chat(messages=[]), 400, "invalid_request", "non-empty"),
        (_chat(messages=[{"role": "wizard", "content": "x"}]), 400, "invalid_request", "wizard"),
        (_chat(messages=["hi"]), 400, "invalid_request", "must be an object"),
        (
            _chat(messages=[{"role": "tool", "content": "x"}]),
            400,
            "invalid_request",
            "tool_call_id",
        ),
        (
            _chat(messages=[{"role": "assistant", "tool_calls": 6.1e-119}]),
            400,
            "invalid_request",
            "tool_calls must be an array of objects",
        ),
        (
            _chat(messages=[{"role": "assistant", "tool_calls": "call"}]),
            400,
            "invalid_request",
            "tool_calls must be an array of objects",
        ),
        (
            _chat(messages=[{"role": "assistant", "tool_calls": [7]}]),
            400,
            "invalid_request",
            "tool_calls must be an array of objects",
        ),
        (_chat(tools=[{"type": "function", "function": {}}]), 400, "invalid_request", "name"),
        (
            _chat(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            400,
            "invalid_request",
            "tool_choice",
        ),
        (_chat(temperature="hot"), 400, "invalid_request", "temperature"),
        (_chat(structured_outputs=""), 400, "invalid_request", "structured_outputs"),
    ],
)
def test_bad_bodies_are_rejected(body: Any, status: int, code: str, fragment: str) -> None:
    error = _rejection(body)
    assert (error.status, error.code) == (status, code)
    assert fragment in error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_program_id_prefers_the_header() -> None:
    assert program_id_for("p-1", {}) == "p-1"
    assert program_id_for(None, {"session_id": "p-2"}) == "p-2"
    assert program_id_for("p-3", {"session_id": "p-3"}) == "p-3"


def test_program_id_defaults_to_a_fresh_one_turn_program() -> None:
    first, second = program_id_for(None, {}), program_id_for(None, {})
    assert first.startswith("oneshot-") and first != second


def test_a_derived_program_id_names_every_turn_of_a_conversation_alike() -> None:
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    opening = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    later = [
        *opening,
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    first = program_id_for(None, {"messages": opening, "tools": tools}, derive=True)
    assert first.startswith("conversation-")
    assert program_id_for(None, {"messages": later, "tools": tools}, derive=True) == first
    other_task = [opening[0], {"role": "user", "content": "Add a feature."}]
    assert program_id_for(None, {"messages": other_task, "tools": tools}, derive=True) != first
    assert program_id_for(None, {"messages": opening}, derive=True) != first
    assert program_id_for(None, {"messages": opening, "tools": tools}).startswith("oneshot-")
    no_user = {"messages": [opening[0]], "tools": tools}
    assert program_id_for(None, no_user, derive=True).startswith("oneshot-")
    assert program_id_for("mine", {"messages": opening}, derive=True) == "mine"


@pytest.mark.parametrize("body", [{"session_id": ""}, {"session_id": 5}])
def test_program_id_must_be_a_non_empty_string(body: dict[str, Any]) -> None:
    with pytest.raises(RequestRejected):
        program_id_for(None, body)


def test_conflicting_program_ids_are_rejected() -> None:
    with pytest.raises(RequestRejected, match="disagree"):
        program_id_for("a", {"session_id": "b"})


@pytest.mark.parametrize(
    ("status", "message", "code", "type_"),
    [
        (
            400,
            "This model's maximum context length is 8192 tokens.",
            "context_length_exceeded",
            "invalid_request_error",
        ),
        (404, "no such thing", "not_found", "invalid_request_error"),
        (422, "bad entity", "unprocessable_entity", "invalid_request_error"),
        (503, "busy", "service_unavailable", "service_unavailable_error"),
        (500, "boom", "internal_server_error", "server_error"),
    ],
)
def test_engine_errors_map_to_openai_codes(
    status: int, message: str, code: str, type_: str
) -> None:
    error = ApiError.from_status(status, message)
    assert (error.code, error.type) == (code, type_)


def test_requests_without_a_program_are_their_programs_last_step() -> None:
    from cluster.openai_protocol import LAST_STEP_ARG
    from deployments.api.parsing import ONESHOT_PREFIX, mark_last_step

    assert program_id_for(None, {}).startswith(ONESHOT_PREFIX)
    with_arguments = parse_chat_body(json.dumps(_chat(vllm_xargs={"other": 1})).encode(), MODELS)
    mark_last_step(with_arguments.request)
    assert with_arguments.request.vllm_xargs == {"other": 1, LAST_STEP_ARG: 1}
    bare = parse_chat_body(json.dumps(_chat()).encode(), MODELS)
    mark_last_step(bare.request)
    assert bare.request.vllm_xargs == {LAST_STEP_ARG: 1}


def test_health_needs_a_ready_replica_of_every_role() -> None:
    engines = [
        {"role": "main", "replica": "a", "state": "ready", "detail": "engine is ready"},
        {"role": "main", "replica": "b", "state": "starting", "detail": "engine is loading"},
    ]
    report = health_report({"main": 2, "draft": 1}, list(engines), redis_reachable=True)
    assert report["status"] == "unavailable"
    assert report["ready_replicas"] == {"main": 1, "draft": 0}
    assert report["components"]["draft"]["status"] == "unavailable"
    assert {"role": "draft", "state": "starting", "detail": "no replica has reported yet"} in (
        report["engines"]
    )
    failed = [engines[0] | {"state": "failed"}]
    assert health_report({"main": 1}, failed, redis_reachable=True)["ready_replicas"] == {"main": 0}


def test_health_is_degraded_while_served_without_redis_or_a_replica() -> None:
    ready = {"role": "main", "replica": "a", "state": "ready", "detail": "engine is ready"}
    loading = {"role": "main", "replica": "b", "state": "starting", "detail": "loading"}

    healthy = health_report({"main": 1}, [ready], redis_reachable=True)
    assert healthy["status"] == "ok"
    assert healthy["components"] == {
        "main": {"status": "ok", "ready_replicas": 1, "replicas": 1},
        "redis": {"status": "ok"},
    }

    without_redis = health_report({"main": 1}, [ready], redis_reachable=False)
    assert without_redis["status"] == "degraded"
    assert without_redis["components"]["redis"]["status"] == "unreachable"
    assert "tool cache" in without_redis["components"]["redis"]["detail"]

    one_of_two = health_report({"main": 2}, [ready, loading], redis_reachable=True)
    assert one_of_two["status"] == "degraded"
    assert one_of_two["components"]["main"] == {
        "status": "degraded",
        "ready_replicas": 1,
        "replicas": 2,
    }
    assert health_report({"main": 2}, [loading], redis_reachable=False)["status"] == "unavailable"

    lost_node = health_report({"main": 2}, [ready], redis_reachable=True)
    assert lost_node["status"] == "degraded"
    assert lost_node["components"]["main"] == {
        "status": "degraded",
        "ready_replicas": 1,
        "replicas": 2,
    }
    assert [engine["state"] for engine in lost_node["engines"]] == ["ready", "pending"]


def test_message_parts_pydantic_reads_lazily_are_checked_and_kept() -> None:
    """A user message's content parts and an assistant's tool calls are iterables
    pydantic validates as they are read; the ingress reads them at once, so an
    invalid part is a 400 there, and what it read stays in the request."""
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    parsed = parse_chat_body(json.dumps(_chat(messages=messages)).encode(), MODELS)
    assert parsed.request.messages[0]["content"] == parts
    assert parsed.request.messages[1]["tool_calls"] == calls
    assert parsed.request.model_dump(mode="json")["messages"][0]["content"] == parts

    bad_part = [{"type": "image_url", "image_url": {"url": ""}, "ttl": {"not": "a part"}}, 7]
    error = _rejection(_chat(messages=[{"role": "user", "content": bad_part}]))
    assert (error.status, error.code) == (400, "invalid_request")

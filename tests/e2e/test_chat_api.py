"""The OpenAI chat API end to end, driven by the real `openai` client."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI
from programs import cluster_program_id

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from cluster.store.pins import TtlLedger

pytestmark = pytest.mark.e2e

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS: list[Any] = [WEATHER_TOOL, TIME_TOOL]
WEATHER_QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def _assert_valid_call(name: str, arguments: str) -> dict[str, Any]:
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    assert name in schemas
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, schemas[name])
    return dict(parsed)


def test_models_lists_the_main_and_draft_models(
    client: OpenAI, model_name: str, cluster_config: ToolserveConfig
) -> None:
    assert cluster_config.draft is not None
    draft = cluster_config.draft.engine.served_model_name
    assert [model.id for model in client.models.list()] == [model_name, draft]


def test_the_draft_model_answers_requests_that_name_it(
    client: OpenAI,
    cluster_config: ToolserveConfig,
    cluster: Endpoints,
    ledger_caught_up: Callable[[], None],
) -> None:
    assert cluster_config.draft is not None
    draft = cluster_config.draft.engine.served_model_name
    program = f"draft-request-{uuid.uuid4().hex[:8]}"
    response = client.chat.completions.with_raw_response.create(
        model=draft,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_headers={"X-Session-ID": program},
    )
    assert response.parse().model == draft
    streamed = client.chat.completions.create(
        model=draft, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
    )
    assert {chunk.model for chunk in streamed} == {draft}
    engines = httpx.get(cluster.health_url, timeout=30).json()["engines"]
    serving_role = "draft" if cluster_config.draft_replicas else "main"
    assert response.headers["x-toolserve-replica"] in {
        engine["replica"] for engine in engines if engine["role"] == serving_role
    }
    ledger_caught_up()
    ledger = TtlLedger(cluster.redis_url)
    assert ledger.lookup(cluster_program_id(program)) is None, (
        "a prediction is not a turn of its program"
    )
    ledger.close()


def assert_text_finish(finish_reason: str, completion_tokens: int, max_tokens: int) -> None:
    """A text reply stops by itself, or at the token cap and only there."""
    if finish_reason == "length":
        assert completion_tokens == max_tokens
    else:
        assert finish_reason == "stop"


def test_health_reports_engines_and_redis(
    cluster: Endpoints, cluster_config: ToolserveConfig
) -> None:
    report = httpx.get(cluster.health_url, timeout=30).json()
    assert report["status"] == "ok"
    roles = {"main"} | ({"draft"} if cluster_config.draft_replicas else set())
    assert {engine["role"] for engine in report["engines"]} == roles
    assert report["components"]["redis"] == {"status": "ok"}
    assert report["components"]["main"]["status"] == "ok"


def test_plain_chat(client: OpenAI, model_name: str) -> None:
    response = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Say hello in one short sentence."}],
        max_tokens=24,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert response.usage is not None and response.usage.completion_tokens > 0
    assert_text_finish(choice.finish_reason, response.usage.completion_tokens, max_tokens=24)


def test_plain_chat_streaming_matches_non_streaming(client: OpenAI, model_name: str) -> None:
    request: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 20,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request).choices[0].message.content
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**request, stream=True)
        if chunk.choices
    ]
    assert len(pieces) > 1
    assert "".join(pieces) == whole


def test_a_stream_waiting_for_its_first_token_gets_keep_alive_comments(
    cluster: Endpoints, cluster_config: ToolserveConfig, model_name: str
) -> None:
    """The shared cluster sends a comment after every `stream_keep_alive_s` of
    silence; a prompt of about a thousand new tokens takes the engine longer than
    that to prefill, so the comments come before the first chunk, and the chunks
    after them are the reply."""
    interval = cluster_config.server.stream_keep_alive_s
    assert interval is not None and interval < 0.1
    words = " ".join(uuid.uuid4().hex for _ in range(120))
    request = {
        "model": model_name,
        "messages": [{"role": "user", "content": f"Repeat the first word of: {words}"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{cluster.api_base}/chat/completions", json=request, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    first_data = next(index for index, line in enumerate(lines) if line.startswith("data: "))
    assert first_data > 0 and set(lines[:first_data]) == {": keep-alive"}
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {line for line in lines if not line.startswith("data: ")} <= {": keep-alive"}


def test_required_tool_call_round_trip(client: OpenAI, model_name: str) -> None:
    first = client.chat.completions.create(
        model=model_name,
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=96,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    call = calls[0]
    assert call.type == "function" and call.id
    _assert_valid_call(call.function.name, call.function.arguments)

    history: list[Any] = [
        *WEATHER_QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, light rain"},
    ]
    second = client.chat.completions.create(
        model=model_name, messages=history, tools=TOOLS, temperature=0, max_tokens=48
    )
    usage = second.usage
    assert usage is not None and usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]
    answer = second.choices[0]
    if answer.message.tool_calls:
        assert answer.finish_reason == "tool_calls"
    else:
        assert answer.message.content
        assert_text_finish(answer.finish_reason, usage.completion_tokens, max_tokens=48)


def test_named_tool_choice_calls_that_tool(client: OpenAI, model_name: str) -> None:
    response = client.chat.completions.create(
        model=model_name,
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=64,
    )
    calls = response.choices[0].message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].function.name == "get_time"
    _assert_valid_call("get_time", calls[0].function.arguments)


def test_tool_choice_none_returns_no_tool_calls(client: OpenAI, model_name: str) -> None:
    response = client.chat.completions.create(
        model=model_name,
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=32,
    )
    assert not response.choices[0].message.tool_calls


def test_streamed_tool_call_equals_non_streamed(client: OpenAI, model_name: str) -> None:
    request: dict[str, Any] = {
        "model": model_name,
        "messages": WEATHER_QUESTION,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 96,
    }
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls
    assert whole

    assembled: dict[int, dict[str, str]] = {}
    finish_reasons = []
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        finish_reasons.append(chunk.choices[0].finish_reason)
        for fragment in delta.tool_calls or []:
            assert fragment.index is not None
            slot = assembled.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
            if fragment.id:
                slot["id"] = fragment.id
            if fragment.function and fragment.function.name:
                slot["name"] += fragment.function.name
            if fragment.function and fragment.function.arguments:
                slot["arguments"] += fragment.function.arguments

    assert "tool_calls" in finish_reasons
    streamed = [assembled[index] for index in sorted(assembled)]
    assert [call["name"] for call in streamed] == [call.function.name for call in whole]
    assert [json.loads(call["arguments"]) for call in streamed] == [
        json.loads(call.function.arguments) for call in whole
    ]
    assert all(call["id"] for call in streamed)


def test_session_id_from_header_or_body_is_echoed(cluster: Endpoints, model_name: str) -> None:
    request = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    }
    by_header = httpx.post(
        f"{cluster.api_base}/chat/completions",
        json=request,
        headers={"X-Session-ID": "program-7"},
        timeout=60,
    )
    assert by_header.status_code == 200
    assert by_header.headers["x-session-id"] == "program-7"
    assert by_header.headers["x-toolserve-replica"]

    by_body = httpx.post(
        f"{cluster.api_base}/chat/completions",
        json=request | {"session_id": "program-8"},
        timeout=60,
    )
    assert by_body.headers["x-session-id"] == "program-8"

    anonymous = httpx.post(f"{cluster.api_base}/chat/completions", json=request, timeout=60)
    assert anonymous.headers["x-session-id"].startswith("oneshot-")


def test_metrics_are_exported(cluster: Endpoints, client: OpenAI, model_name: str) -> None:

    client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    deadline = time.monotonic() + 90
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(cluster.metrics_url, timeout=10).text
        if "toolserve_api_requests" in text and "vllm" in text:
            break
        time.sleep(2)
    assert "toolserve_api_requests" in text
    assert "vllm" in text

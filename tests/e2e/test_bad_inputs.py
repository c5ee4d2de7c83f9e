"""Bad input gets a clear OpenAI-style error and leaves the server healthy."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from cluster.launch.launcher import Endpoints

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("healthy_after")]


def _assert_error_body(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["type"]
    assert error["code"]
    if code is not None:
        assert error["code"] == code
    assert "Traceback" not in response.text


def _post(cluster: Endpoints, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{cluster.api_base}/chat/completions", timeout=60, **kwargs)


def test_malformed_json(cluster: Endpoints) -> None:
    response = _post(
        cluster,
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    _assert_error_body(response, 400, "invalid_request")
    assert "JSON" in response.json()["error"]["message"]


def test_body_not_an_object(cluster: Endpoints) -> None:
    _assert_error_body(_post(cluster, json=[1, 2]), 400, "invalid_request")


def test_unknown_model(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.code == "model_not_found"


def test_invalid_message_role(cluster: Endpoints, model_name: str) -> None:
    response = _post(
        cluster, json={"model": model_name, "messages": [{"role": "wizard", "content": "hi"}]}
    )
    _assert_error_body(response, 400, "invalid_request")


def test_messages_missing(cluster: Endpoints, model_name: str) -> None:
    _assert_error_body(_post(cluster, json={"model": model_name}), 400, "invalid_request")


def test_invalid_tool_definition(client: OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"description": "no name"}}],  # type: ignore[list-item, typeddict-item]
        )
    assert raised.value.status_code == 400


def test_named_tool_choice_of_unknown_tool(client: OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "hi"}],
            tools=[
                {
                    "type": "function",
                    "function": {"name": "known", "parameters": {"type": "object"}},
                }
            ],
            tool_choice={"type": "function", "function": {"name": "unknown"}},
        )


def test_context_overflow(cluster: Endpoints, model_name: str) -> None:
    huge = "lorem ipsum dolor sit amet " * 4000
    response = _post(
        cluster, json={"model": model_name, "messages": [{"role": "user", "content": huge}]}
    )
    _assert_error_body(response, 400, "context_length_exceeded")


def test_a_seeded_request_split_across_engine_steps_is_served(
    client: OpenAI, model_name: str
) -> None:
    """A prompt past the engine's per-step token budget is prefilled in several
    steps; vLLM's CPU engine dies on such a request when it is seeded (its CPU
    generator cannot be rewound), so the server samples it without the seed. The
    engine lives on: the next request and `healthy_after` are answered."""
    prompt = " ".join(["amber", "violet", "cobalt"] * 1100) + "\nName one colour."
    reply = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=4,
        temperature=0.8,
        seed=11,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens > 3000
    assert reply.choices[0].finish_reason in ("length", "stop")
    again = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Say OK."}], max_tokens=2
    )
    assert again.choices[0].finish_reason in ("length", "stop")


def test_conflicting_session_ids(cluster: Endpoints, model_name: str) -> None:
    response = _post(
        cluster,
        json={
            "model": model_name,
            "messages": [{"role": "user", "content": "hi"}],
            "session_id": "a",
        },
        headers={"X-Session-ID": "b"},
    )
    _assert_error_body(response, 400, "invalid_request")


def test_unknown_route_is_openai_style(cluster: Endpoints) -> None:
    response = httpx.get(f"{cluster.api_base}/no-such-endpoint", timeout=30)
    _assert_error_body(response, 404)


def _chat(model: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    } | fields


def test_a_body_past_the_size_limit_is_413(cluster: Endpoints) -> None:
    ten_megabytes = b'{"messages": [{"role": "user", "content": "' + b"x" * 10_000_000 + b'"}]}'
    _assert_error_body(_post(cluster, content=ten_megabytes), 413, "request_too_large")


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "Hi"}], "top_p": Infinity}',
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        b'{"messages": [{"role": "user", "content": "x"}'
        + b', {"role": "user", "content": "x"}' * 100_000
        + b"]}",
    ],
    ids=["NaN", "Infinity", "invalid UTF-8", "nested 20k deep", "100k messages"],
)
def test_json_python_accepts_but_json_does_not_or_too_much_of_it_is_400(
    cluster: Endpoints, body: bytes
) -> None:
    _assert_error_body(_post(cluster, content=body), 400, "invalid_request")


@pytest.mark.parametrize(
    ("headers", "body_fields"),
    [
        ({"X-Session-ID": "s" * 10_000}, {}),
        ({}, {"session_id": "agent\n7"}),
        ({}, {"session_id": "agent\x007"}),
    ],
    ids=["10k-character header", "newline in body id", "NUL in body id"],
)
def test_oversized_or_unprintable_session_ids_are_400(
    cluster: Endpoints, model_name: str, headers: dict[str, str], body_fields: dict[str, Any]
) -> None:
    response = _post(cluster, json=_chat(model_name, **body_fields), headers=headers)
    _assert_error_body(response, 400, "invalid_request")
    assert response.json()["error"]["param"] == "session_id"


RECURSIVE_PARAMETERS = {
    "type": "object",
    "properties": {"node": {"$ref": "#/$defs/node"}},
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
}


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 10**12},
        {"n": 2, "tools": "weather"},
        {"logprobs": True, "top_logprobs": 2},
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "banana"}}}
            ]
        },
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": RECURSIVE_PARAMETERS}}
            ]
        },
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": RECURSIVE_PARAMETERS}}
            ],
            "tool_choice": "required",
        },
    ],
    ids=[
        "huge max_tokens",
        "n=2 with tools",
        "logprobs",
        "tool schema not JSON Schema",
        "recursive tool schema",
        "recursive tool schema, required",
    ],
)
def test_unusual_requests_are_served_or_refused_cleanly(
    cluster: Endpoints, model_name: str, weather_tool: dict[str, Any], fields: dict[str, Any]
) -> None:
    if fields.get("tools") == "weather":
        fields = fields | {"tools": [weather_tool]}
    response = _post(cluster, json=_chat(model_name, **fields))
    if response.status_code == 200:
        assert response.json()["choices"], response.text
    else:
        _assert_error_body(response, 400)


def _stalled_stream(cluster: Endpoints, model: str) -> socket.socket:
    """A streaming turn whose client reads the response head, then stops reading."""
    url = httpx.URL(cluster.api_base)
    body = json.dumps(_chat(model, max_tokens=256, stream=True, ignore_eos=True)).encode()
    connection = socket.create_connection((url.host, url.port), timeout=60)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.sendall(
        f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert connection.recv(64).startswith(b"HTTP/1.1 200"), "the stream did not start"
    return connection


def test_clients_that_stop_reading_a_stream_hold_up_no_one_else(
    cluster: Endpoints, client: OpenAI, model_name: str
) -> None:
    stalled = [_stalled_stream(cluster, model_name) for _ in range(6)]
    try:
        reply = client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=8,
            timeout=120,
        )
        assert reply.choices[0].message.content is not None
    finally:
        for connection in stalled:
            connection.close()
    after = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert after.choices[0].message.content is not None

"""Bad input gets a clear OpenAI-style error and leaves the server healthy."""

from __future__ import annotations

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

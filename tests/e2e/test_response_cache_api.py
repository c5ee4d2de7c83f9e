"""The response cache on the running cluster, through the `openai` SDK: an exact
repeat of a greedy request is answered from the kept reply (plain and streamed),
another API key or session does not see it, a sampled request is not cached, and
`Cache-Control: no-cache` asks the engine again; a reply that hands calls to the
client is kept only when the server runs no tools for the request."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_text import metric_total

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e

CACHE_HEADER = "x-toolserve-cache"


def _question() -> list[Any]:
    return [{"role": "user", "content": f"Name a colour. ({uuid.uuid4().hex[:8]})"}]


def _ask(
    client: OpenAI, model: str, messages: list[Any], **options: Any
) -> tuple[str | None, str, str]:
    """The cache header, the reply's id and its text."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, **({"max_tokens": 8} | options)
    )
    reply = raw.parse()
    return raw.headers.get(CACHE_HEADER), reply.id, reply.choices[0].message.content or ""


def _hits(cluster: Endpoints) -> float:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return metric_total(text, "toolserve_response_cache_lookups_total", result="hit")


def test_an_exact_repeat_is_answered_from_the_kept_reply(
    cluster: Endpoints, client: OpenAI, model_name: str
) -> None:
    hits_before = _hits(cluster)
    messages = _question()
    first = _ask(client, model_name, messages, temperature=0)
    again = _ask(client, model_name, messages, temperature=0)
    assert (first[0], again[0]) == ("miss", "hit")
    assert again[2] == first[2]
    assert again[1] != first[1], "a repeat is a new response, with its own id"

    deadline = time.monotonic() + 90
    while _hits(cluster) <= hits_before:
        assert time.monotonic() < deadline, "the hit never reached the metrics"
        time.sleep(2)


def test_another_api_key_or_session_does_not_see_the_kept_reply(
    cluster: Endpoints, client: OpenAI, model_name: str
) -> None:
    messages = _question()
    assert _ask(client, model_name, messages, temperature=0)[0] == "miss"
    other_key = OpenAI(
        base_url=cluster.api_base, api_key="response-cache-other", max_retries=0, timeout=120
    )
    assert _ask(other_key, model_name, messages, temperature=0)[0] == "miss"
    session = {"X-Session-ID": f"response-cache-{uuid.uuid4().hex[:8]}"}
    assert _ask(client, model_name, messages, temperature=0, extra_headers=session)[0] == "miss"
    assert _ask(client, model_name, messages, temperature=0, extra_headers=session)[0] == "hit"
    assert _ask(other_key, model_name, messages, temperature=0)[0] == "hit"


def test_a_streamed_repeat_is_served_as_a_stream(client: OpenAI, model_name: str) -> None:
    messages = _question()

    def streamed() -> tuple[str | None, list[str], set[str]]:
        raw = client.chat.completions.with_raw_response.create(
            model=model_name,
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, ids = [], set()
        for chunk in raw.parse():
            ids.add(chunk.id)
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        return raw.headers.get(CACHE_HEADER), pieces, ids

    first_header, first_pieces, first_ids = streamed()
    again_header, again_pieces, again_ids = streamed()
    assert (first_header, again_header) == ("miss", "hit")
    assert again_pieces == first_pieces and len(again_pieces) > 1
    assert len(again_ids) == 1 and again_ids != first_ids
    plain = _ask(client, model_name, messages, temperature=0)
    assert plain[0] == "miss", "a plain request is not the streamed one"


def test_sampled_requests_go_to_the_engine_and_seeded_ones_are_kept(
    client: OpenAI, model_name: str
) -> None:
    messages = _question()
    assert _ask(client, model_name, messages, temperature=0.8)[0] is None
    assert _ask(client, model_name, messages, temperature=0.8)[0] is None
    seeded = [_ask(client, model_name, messages, temperature=0.8, seed=11) for _ in range(2)]
    assert [header for header, _, _ in seeded] == ["miss", "hit"]
    assert seeded[0][2] == seeded[1][2]


def test_no_cache_asks_the_engine_again_and_no_store_keeps_nothing(
    client: OpenAI, model_name: str
) -> None:
    messages = _question()
    no_store = {"Cache-Control": "no-store"}
    assert _ask(client, model_name, messages, temperature=0, extra_headers=no_store)[0] == "miss"
    assert _ask(client, model_name, messages, temperature=0)[0] == "miss"
    no_cache = {"Cache-Control": "no-cache"}
    assert _ask(client, model_name, messages, temperature=0, extra_headers=no_cache)[0] == "miss"
    assert _ask(client, model_name, messages, temperature=0)[0] == "hit"


def test_a_reply_that_hands_calls_to_the_client_is_kept_only_without_server_tools(
    client: OpenAI, model_name: str, weather_tool: dict[str, Any]
) -> None:
    """With server tools on, a repeat may be continued with a result the client
    posted for the call in between, so the reply is not kept."""
    messages = [{"role": "user", "content": f"Weather in Oslo? ({uuid.uuid4().hex[:8]})"}]
    call = {"tools": [weather_tool], "tool_choice": "required", "temperature": 0, "max_tokens": 64}
    assert _ask(client, model_name, messages, **call)[0] == "miss"
    assert _ask(client, model_name, messages, **call)[0] == "miss"
    client_runs_tools = {"toolserve": {"execute_tools": False}}
    assert _ask(client, model_name, messages, **call, extra_body=client_runs_tools)[0] == "miss"
    assert _ask(client, model_name, messages, **call, extra_body=client_runs_tools)[0] == "hit"

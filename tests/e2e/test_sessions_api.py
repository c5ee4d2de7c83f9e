"""Session control through the whole cluster: open a session, fork a sub-agent's
session from a pinned parent (the child's first turn hits the parent's cached
prefix on the parent's replica, and the parent keeps its pin), look sessions up,
no other API key can see or fork them, and SGLang's open and close routes."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e

SYSTEM = (
    "You are a planning agent. Split the user's task into steps, call a tool for "
    "each step that needs data, and report what you found in one short paragraph."
)


def _root(cluster: Endpoints) -> str:
    return cluster.api_base.removesuffix("/v1")


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def _session(cluster: Endpoints, api_key: str, program: str) -> httpx.Response:
    return httpx.get(f"{cluster.api_base}/sessions/{program}", headers=_auth(api_key), timeout=30)


def _open(cluster: Endpoints, api_key: str, body: dict[str, Any] | None) -> httpx.Response:
    return httpx.post(f"{cluster.api_base}/sessions", json=body, headers=_auth(api_key), timeout=30)


def test_a_fork_shares_its_parents_prefix_and_leaves_its_pin(
    client: OpenAI, model_name: str, cluster: Endpoints, weather_tool: dict[str, Any]
) -> None:
    key = str(client.api_key)
    opened = _open(cluster, key, None)
    assert opened.status_code == 200, opened.text
    parent = opened.json()["id"]
    assert opened.json() == {
        "id": parent,
        "object": "session",
        "parent_id": None,
        "pinned": None,
        "prefix": None,
    }

    conversation = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Compare the weather in Oslo and Lima."},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=conversation,  # type: ignore[arg-type]
        tools=[weather_tool],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=32,
        temperature=0,
        extra_headers={"X-Session-ID": parent},
        # The parent's tool outlasts the child's turn, as a sub-agent's parent
        # waits on it; without the hint the pin may lapse before the check.
        extra_body={"toolserve": {"retain_for_s": 120}},
    )
    parent_replica = raw.headers["x-toolserve-replica"]
    pinned = _session(cluster, key, parent).json()["pinned"]
    assert pinned is not None and pinned["replica"] == parent_replica and pinned["tokens"] > 0

    child = f"sub-agent-{uuid.uuid4().hex[:8]}"
    forked = _open(cluster, key, {"id": child, "parent_id": parent})
    assert forked.status_code == 200, forked.text
    assert forked.json()["parent_id"] == parent

    raw_child = client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=[*conversation, {"role": "user", "content": "Only Oslo, please."}],  # type: ignore[list-item]
        tools=[weather_tool],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=32,
        temperature=0,
        extra_headers={"X-Session-ID": child},
    )
    reply = raw_child.parse()
    assert raw_child.headers["x-toolserve-replica"] == parent_replica
    details = reply.usage.prompt_tokens_details if reply.usage else None
    assert details is not None and (details.cached_tokens or 0) > 0, reply.usage
    assert _session(cluster, key, parent).json()["pinned"] is not None, "the fork took the pin"
    assert _session(cluster, key, child).json()["parent_id"] == parent

    for program in (child, parent):
        ended = httpx.delete(
            f"{cluster.api_base}/sessions/{program}", headers=_auth(key), timeout=30
        )
        assert ended.status_code == 200, ended.text
    assert _session(cluster, key, parent).status_code == 404


def test_another_key_can_neither_see_nor_fork_a_session(cluster: Endpoints) -> None:
    program = f"private-{uuid.uuid4().hex[:8]}"
    assert _open(cluster, "tenant-a", {"id": program}).status_code == 200
    assert _session(cluster, "tenant-a", program).status_code == 200
    seen = _session(cluster, "tenant-b", program)
    assert seen.status_code == 404 and seen.json()["error"]["code"] == "session_not_found"
    fork = _open(cluster, "tenant-b", {"parent_id": program})
    assert fork.status_code == 404 and fork.json()["error"]["param"] == "parent_id"
    itself = _open(cluster, "tenant-a", {"id": program, "parent_id": program})
    assert itself.status_code == 400
    assert _open(cluster, "tenant-a", {"parent": program}).status_code == 422
    httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=_auth("tenant-a"), timeout=30)


def test_sglangs_open_and_close_session_routes(cluster: Endpoints) -> None:
    key = "tenant-sglang"
    opened = httpx.post(
        f"{_root(cluster)}/open_session",
        json={"capacity_of_str_len": 65536, "session_id": "sub-1", "streaming": True},
        headers=_auth(key),
        timeout=30,
    )
    assert opened.status_code == 200 and opened.json() == "sub-1", opened.text
    assert _session(cluster, key, "sub-1").status_code == 200
    named = httpx.post(
        f"{_root(cluster)}/open_session",
        json={"capacity_of_str_len": 65536},
        headers=_auth(key),
        timeout=30,
    )
    assert named.status_code == 200 and isinstance(named.json(), str)
    for session in ("sub-1", named.json()):
        closed = httpx.post(
            f"{_root(cluster)}/close_session",
            json={"session_id": session},
            headers=_auth(key),
            timeout=30,
        )
        assert closed.status_code == 200 and closed.content == b"", closed.text
    again = httpx.post(
        f"{_root(cluster)}/close_session",
        json={"session_id": "sub-1"},
        headers=_auth(key),
        timeout=30,
    )
    assert again.status_code == 404 and again.json()["error"]["code"] == "session_not_found"
    malformed = httpx.post(
        f"{_root(cluster)}/close_session", json={"id": "sub-1"}, headers=_auth(key), timeout=30
    )
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == "body.session_id"

"""KV pinning through the whole cluster: a tool-calling turn pins the program's KV
on the replica that served it, the TTL ledger in Redis says so, and closing the
session releases it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai import OpenAI
from programs import TEST_CLIENT_AUTH, cluster_program_id

from cluster.launch.launcher import Endpoints
from cluster.store.pins import LedgerEntry, TtlLedger

pytestmark = pytest.mark.e2e

LIST_FILES_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "list_files",
        "description": "List the files in a directory.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}


def wait_for(check: Any, timeout_s: float = 15) -> Any:
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def list_files_turn(client: OpenAI, model: str, program: str, directory: str) -> None:
    """A turn of `program` that calls the list_files tool."""
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Which files are in {directory}?"}],
        tools=[LIST_FILES_TOOL],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        extra_headers={"X-Session-ID": program},
    )


def ledger_gone(ledger: TtlLedger, program_in_cluster: str) -> bool | None:
    return True if ledger.lookup(program_in_cluster) is None else None


def test_tool_turn_is_pinned_in_the_ledger_until_the_session_closes(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    program = f"pinning-e2e-{uuid.uuid4().hex[:8]}"
    raw = client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=[{"role": "user", "content": "Which files are in /src?"}],
        tools=[LIST_FILES_TOOL],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        extra_headers={"X-Session-ID": program},
    )
    reply = raw.parse()
    replica = raw.headers["x-toolserve-replica"]
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "list_files"

    ledger = TtlLedger(cluster.redis_url)
    entry: LedgerEntry | None = wait_for(
        lambda: (
            found if (found := ledger.lookup(cluster_program_id(program))) and found.tool else None
        )
    )
    assert entry is not None, "the pin never reached the ledger"
    assert entry.replica_id == replica
    assert entry.tool == "list_files"
    assert entry.tokens > 0
    assert entry.expires_at > time.time()

    closed = httpx.delete(
        f"{cluster.api_base}/sessions/{program}", headers=TEST_CLIENT_AUTH, timeout=30
    )
    assert closed.status_code == 200
    assert closed.json() == {"id": program, "object": "session", "deleted": True}
    assert wait_for(lambda: ledger_gone(ledger, cluster_program_id(program)))
    ledger.close()


def test_the_same_session_id_from_two_api_keys_names_two_programs(
    model_name: str, cluster: Endpoints, ledger_caught_up: Callable[[], None]
) -> None:
    program = f"tenants-e2e-{uuid.uuid4().hex[:8]}"
    owner = OpenAI(base_url=cluster.api_base, api_key="tenant-a", max_retries=0, timeout=120)
    list_files_turn(owner, model_name, program, "/src")
    ledger = TtlLedger(cluster.redis_url)
    owners_pin = cluster_program_id(program, "tenant-a")
    assert wait_for(lambda: ledger.lookup(owners_pin)), "the owner's pin never reached the ledger"

    other = httpx.delete(
        f"{cluster.api_base}/sessions/{program}",
        headers={"Authorization": "Bearer tenant-b"},
        timeout=30,
    )
    assert other.status_code == 404, other.text
    assert other.json()["error"]["code"] == "session_not_found"
    ledger_caught_up()
    assert ledger.lookup(owners_pin) is not None, "another key ended the owner's program"
    assert ledger.lookup(program) is None and ledger.lookup(cluster_program_id(program)) is None

    mine = httpx.delete(
        f"{cluster.api_base}/sessions/{program}",
        headers={"Authorization": "Bearer tenant-a"},
        timeout=30,
    )
    assert mine.json() == {"id": program, "object": "session", "deleted": True}
    assert wait_for(lambda: ledger_gone(ledger, owners_pin))
    ledger.close()
    again = httpx.delete(
        f"{cluster.api_base}/sessions/{program}",
        headers={"Authorization": "Bearer tenant-a"},
        timeout=30,
    )
    assert again.status_code == 404, "an ended session is no longer known"


def test_requests_without_a_session_pin_nothing(
    client: OpenAI, model_name: str, cluster: Endpoints, ledger_caught_up: Callable[[], None]
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=[{"role": "user", "content": "Which files are in /tmp?"}],
        tools=[LIST_FILES_TOOL],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
    )
    program = raw.headers["x-session-id"]
    assert program.startswith("oneshot-")
    ledger_caught_up()
    ledger = TtlLedger(cluster.redis_url)
    assert ledger.lookup(cluster_program_id(program)) is None
    ledger.close()


def test_pinning_metrics_are_exported(client: OpenAI, model_name: str, cluster: Endpoints) -> None:
    program = f"pinning-metrics-{uuid.uuid4().hex[:8]}"
    list_files_turn(client, model_name, program, "/etc")

    def pins_exported() -> str | None:
        text = httpx.get(cluster.metrics_url, timeout=30).text
        return text if "toolserve_kv_pins" in text and "toolserve_kv_pin_ttl_s" in text else None

    text = wait_for(pins_exported, timeout_s=60)
    assert text is not None, "pinning metrics never appeared"
    httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=TEST_CLIENT_AUTH, timeout=30)

"""Agent hints through the whole cluster, sent as clients written for Dynamo,
SGLang and vLLM's proposals send them (the openai SDK's `extra_body`): the
session they name is the program, a retain-for hint is the pin's TTL in the TTL
ledger, a close leaves nothing pinned, the hints are counted in the metrics, and
a malformed hint is an OpenAI-style 400."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from programs import cluster_program_id
from prometheus_text import metric_total

from cluster.launch.launcher import Endpoints
from cluster.store.pins import LedgerEntry, TtlLedger

pytestmark = pytest.mark.e2e

RETAIN_FOR_S = 7.0


def _tool_turn(
    client: OpenAI, model: str, tool: dict[str, Any], extra_body: dict[str, Any]
) -> tuple[str, float]:
    """A turn that calls `tool`: the program id the server answered with, and
    when the reply came."""
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=32,
        temperature=0,
        extra_body=extra_body,
    )
    return raw.headers["x-session-id"], time.time()


def _ledger_entry(ledger: TtlLedger, program: str, timeout_s: float = 30) -> LedgerEntry | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = ledger.lookup(cluster_program_id(program))
        if entry is not None and entry.tool:
            return entry
        time.sleep(0.2)
    return None


def test_a_session_named_in_sglangs_params_keeps_its_kv_for_vllms_retain_hint(
    client: OpenAI, model_name: str, cluster: Endpoints, weather_tool: dict[str, Any]
) -> None:
    program = f"hints-sglang-{uuid.uuid4().hex[:8]}"
    answered_as, replied_at = _tool_turn(
        client,
        model_name,
        weather_tool,
        {
            "session_params": {"id": program},
            "agent_hint": {"cache_control": {"type": "ephemeral", "ttl": RETAIN_FOR_S}},
        },
    )
    assert answered_as == program
    ledger = TtlLedger(cluster.redis_url)
    entry = _ledger_entry(ledger, program)
    assert entry is not None, "the hinted program's pin never reached the ledger"
    # Pinned when the turn finished, a moment before the reply reached the client.
    remaining = entry.expires_at - replied_at
    assert RETAIN_FOR_S - 3 < remaining <= RETAIN_FOR_S, remaining
    httpx.delete(
        f"{cluster.api_base}/sessions/{program}",
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=30,
    )
    ledger.close()


def test_a_dynamo_close_ends_the_program_and_hints_are_counted(
    client: OpenAI,
    model_name: str,
    cluster: Endpoints,
    weather_tool: dict[str, Any],
    ledger_caught_up: Callable[[], None],
) -> None:
    program = f"hints-dynamo-{uuid.uuid4().hex[:8]}"
    control = {"session_id": program, "action": "close"}
    nvext = {"agent_hints": {"priority": 1, "osl": 64}, "session_control": control}
    answered_as, _ = _tool_turn(client, model_name, weather_tool, {"nvext": nvext})
    assert answered_as == program
    ledger_caught_up()
    ledger = TtlLedger(cluster.redis_url)
    assert ledger.lookup(cluster_program_id(program)) is None, "a closed session stayed pinned"
    ledger.close()

    def counted() -> float | None:
        text = httpx.get(cluster.metrics_url, timeout=30).text
        closed = metric_total(text, "toolserve_agent_hints_total", hint="dynamo.last_turn")
        return closed if closed else None

    deadline = time.monotonic() + 60
    while (closes := counted()) is None and time.monotonic() < deadline:
        time.sleep(1)
    assert closes is not None and closes >= 1, "the close never showed in the metrics"


@pytest.mark.parametrize(
    "extra_body",
    [
        {"nvext": {"agent_hints": {"priority": "urgent"}}},
        {"retention_seconds": -3},
        {"session_params": {"id": "a"}, "agent_hint": {"session_id": "b"}},
    ],
)
def test_a_malformed_hint_is_an_openai_style_400(
    client: OpenAI, model_name: str, extra_body: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body=extra_body,
        )
    error = refused.value.body
    assert isinstance(error, dict) and error.get("code") == "invalid_request", error
    assert error.get("type") == "invalid_request_error", error

"""Speculative tool calls on the shared cluster: a call the predictors foresee
runs once, early, and the model's own call reuses it. Real Ray, Redis, vLLM
(SmolLM2, main and draft) and the `openai` SDK."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from bench.tools import record_text
from cluster.launcher import Endpoints

pytestmark = pytest.mark.e2e

LOOKUP_CHOICE = {"type": "function", "function": {"name": "lookup_record"}}


def _lookup_tool(cluster: Endpoints) -> list[dict[str, Any]]:
    listed = httpx.get(f"{cluster.api_base}/tools", timeout=30).json()["data"]
    return [tool for tool in listed if tool["function"]["name"] == "lookup_record"]


def _metric_total(text: str, sample_name: str, **labels: str) -> float:
    """A sample summed over the label sets that contain `labels` (names may carry
    Ray's `ray_` prefix)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.removeprefix("ray_") == sample_name
        and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def test_a_correctly_predicted_call_runs_once_and_is_reused(
    client: OpenAI, model_name: str, cluster: Endpoints, lookup_ledger: Path
) -> None:
    tools = _lookup_tool(cluster)
    agent = [
        {"role": "system", "content": f"You are records agent {uuid.uuid4().hex[:6]}."},
        {"role": "user", "content": "Look up the record INC-2041 and summarize it."},
    ]

    def turn(messages: list[Any], program: str, **extra: Any) -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=messages,
            tools=tools,
            temperature=0,
            max_tokens=48,
            extra_headers={"X-Session-ID": program},
            **extra,
        )

    probe = turn(
        agent,
        f"probe-{uuid.uuid4().hex[:6]}",
        tool_choice=LOOKUP_CHOICE,
        extra_body={"toolserve": {"execute_tools": False}},
    )
    (call,) = probe.choices[0].message.tool_calls or []
    key = json.loads(call.function.arguments)["key"]
    made_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call.model_dump(exclude_none=True)],
    }
    result = {"role": "tool", "tool_call_id": call.id, "content": record_text(key)}
    for _ in range(2):  # the agent kind's history teaches the learned predictor
        turn([*agent, made_call, result], f"teach-{uuid.uuid4().hex[:6]}", tool_choice="none")

    runs_before = _runs(lookup_ledger).count(key)
    response = turn(agent, f"predicted-{uuid.uuid4().hex[:6]}", tool_choice=LOOKUP_CHOICE)
    executed = ((response.model_extra or {}).get("toolserve") or {}).get("executed_messages")
    assert executed, "the server should have answered the lookup"
    assert executed[1]["content"] == record_text(key)
    assert _runs(lookup_ledger).count(key) == runs_before + 1, "one run, shared"

    deadline = time.monotonic() + 90
    used = saved = 0.0
    while time.monotonic() < deadline and not (used and saved):
        text = httpx.get(cluster.metrics_url, timeout=10).text
        used = _metric_total(text, "toolserve_speculations_used_total", source="learned")
        saved = _metric_total(
            text, "toolserve_tool_time_saved_s_count", origin="speculation:learned"
        )
        time.sleep(2)
    assert used >= 1, "the learned prediction matched the model's call"
    assert saved >= 1, "the model's call reused the speculative run"


def _runs(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []

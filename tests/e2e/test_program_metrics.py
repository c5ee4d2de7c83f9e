"""Program-level metrics on the real cluster: a program of turns that the client
ends with DELETE is counted with its completion time and turns, each turn's
latency under its index in the program, and a turn without a session is a
one-turn program ended by its last step."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from programs import TEST_CLIENT_AUTH
from prometheus_text import histogram_buckets, metric_total

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e


def _samples(cluster: Endpoints) -> dict[str, float]:
    """Counts only: Ray exports a histogram's `_sum` from bucket midpoints."""
    text = httpx.get(cluster.metrics_url, timeout=30).text
    if "toolserve_program_completion_s" not in text:
        return {}
    turns = histogram_buckets(text, "toolserve_program_turns")
    return {
        "deleted": metric_total(text, "toolserve_program_completion_s_count", reason="deleted"),
        "last_step": metric_total(text, "toolserve_program_completion_s_count", reason="last_step"),
        "one_turn_programs": turns.get(1.0, 0.0),
        "three_turn_programs": turns.get(3.0, 0.0) - turns.get(2.0, 0.0),
        "third_turns": metric_total(text, "toolserve_turn_latency_s_count", turn="3-4"),
    }


def test_a_programs_completion_time_and_turns_are_measured(
    cluster: Endpoints, client: OpenAI, model_name: str
) -> None:
    before = _samples(cluster)
    program = f"metrics-{uuid.uuid4().hex[:8]}"
    messages: list[Any] = [{"role": "user", "content": "Count to three."}]
    started = time.monotonic()
    for _ in range(3):
        reply = client.chat.completions.create(
            model=model_name,
            messages=messages,
            max_tokens=8,
            extra_headers={"X-Session-ID": program},
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "Go on."},
        ]
    elapsed_s = time.monotonic() - started
    ended = httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=TEST_CLIENT_AUTH)
    assert ended.status_code == 200
    client.chat.completions.create(  # no session id: a one-turn program
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )

    def counted() -> dict[str, float] | None:
        after = _samples(cluster)
        grew = after and all(after[key] > before.get(key, 0) for key in after)
        return after if grew else None

    deadline = time.monotonic() + 90
    after = counted()
    while after is None and time.monotonic() < deadline:
        time.sleep(2)
        after = counted()
    assert after is not None, (before, _samples(cluster))
    # Earlier tests' programs may end in the same window (metrics are exported
    # every few seconds), so each count has grown by at least one.
    print(f"program of 3 turns took {elapsed_s:.1f}s at the client; metrics {after}")

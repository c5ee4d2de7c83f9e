"""Per-tenant quotas on the running cluster, with the openai SDK: one tenant's
limits of its own (tests/support/quota_tenant.py: 0.2 requests a second with a
burst of 2, one program at a time) answer its excess with OpenAI-style 429s
carrying Retry-After, while other tenants go on; the SDK's own retries get
through once the quota allows."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from prometheus_text import metric_total
from quota_tenant import QUOTA_TENANT_KEY

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e


def _turn(client: OpenAI, model: str, program: str) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Say hi ({program})."}],
        max_tokens=1,
        temperature=0,
        extra_headers={"X-Session-ID": program, "Cache-Control": "no-cache"},
    )


def test_a_tenants_excess_is_a_429_with_retry_after_and_others_go_on(
    cluster: Endpoints, model_name: str, healthy_after: None
) -> None:
    limited = OpenAI(base_url=cluster.api_base, api_key=QUOTA_TENANT_KEY, max_retries=0)
    other = OpenAI(base_url=cluster.api_base, api_key="e2e-unlimited-tenant", max_retries=0)
    first, second = f"quota-a-{uuid.uuid4().hex[:6]}", f"quota-b-{uuid.uuid4().hex[:6]}"

    _turn(limited, model_name, first)
    with pytest.raises(openai.RateLimitError) as too_many_programs:
        _turn(limited, model_name, second)
    refusal = too_many_programs.value
    assert refusal.status_code == 429
    assert refusal.response.headers["retry-after"] == "5"
    assert refusal.response.json()["error"]["code"] == "rate_limit_exceeded"
    assert refusal.response.json()["error"]["type"] == "requests"

    _turn(limited, model_name, first)  # its running program goes on: the burst's second
    with pytest.raises(openai.RateLimitError) as too_fast:
        _turn(limited, model_name, first)
    assert int(too_fast.value.response.headers["retry-after"]) >= 1
    assert "per second" in too_fast.value.response.json()["error"]["message"]

    # The SDK's own retries, honouring Retry-After, get the next turn through.
    statuses: list[int] = []
    retrying = OpenAI(
        base_url=cluster.api_base,
        api_key=QUOTA_TENANT_KEY,
        max_retries=4,
        http_client=httpx.Client(
            event_hooks={"response": [lambda response: statuses.append(response.status_code)]}
        ),
    )
    assert _turn(retrying, model_name, first).choices
    assert statuses[0] == 429 and statuses[-1] == 200, statuses

    for index in range(5):  # another tenant is not held up by these quotas
        _turn(other, model_name, f"quota-other-{index}-{uuid.uuid4().hex[:6]}")

    ended = httpx.delete(
        f"{cluster.api_base}/sessions/{first}",
        headers={"Authorization": f"Bearer {QUOTA_TENANT_KEY}"},
        timeout=30,
    )
    assert ended.status_code == 200, ended.text
    assert _turn(retrying, model_name, second).choices  # its first program has ended

    text = httpx.get(cluster.metrics_url, timeout=30).text
    deadline = time.monotonic() + 60
    while metric_total(text, "toolserve_quota_refusals_total", quota="programs") < 1:
        assert time.monotonic() < deadline, "the refusals never showed in the metrics"
        time.sleep(1)
        text = httpx.get(cluster.metrics_url, timeout=30).text
    assert metric_total(text, "toolserve_quota_refusals_total", quota="requests_per_s") >= 1

"""Tenants on the running cluster: each API key's prompt prefixes are its own in
the engine's cache, and a session is known only to the key that used it."""

from __future__ import annotations

import uuid

import httpx
import pytest
from openai import OpenAI

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e


def _cached_prompt_tokens(client: OpenAI, model: str, prompt: str) -> int:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=1,
        temperature=0,
        extra_headers={"Cache-Control": "no-cache"},  # the engine's cache, not the replies'
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


def test_prefix_cache_hits_do_not_cross_tenants(cluster: Endpoints, model_name: str) -> None:
    def as_key(key: str) -> OpenAI:
        return OpenAI(base_url=cluster.api_base, api_key=key, max_retries=0, timeout=120)

    tenant_a, tenant_b = as_key("prefix-tenant-a"), as_key("prefix-tenant-b")
    marker = uuid.uuid4().hex
    prompt = f"Reference {marker}. " + " ".join(
        f"line {n}: the value is {n * 7}." for n in range(60)
    )

    assert _cached_prompt_tokens(tenant_a, model_name, prompt) == 0
    assert _cached_prompt_tokens(tenant_b, model_name, prompt) == 0, "B hit A's cached prefix"
    assert _cached_prompt_tokens(tenant_a, model_name, prompt) > 0, "A's own prefix was not kept"
    assert _cached_prompt_tokens(tenant_b, model_name, prompt) > 0, "B's own prefix was not kept"


def test_ending_a_session_the_caller_never_used_is_404(cluster: Endpoints) -> None:
    response = httpx.delete(
        f"{cluster.api_base}/sessions/never-used-{uuid.uuid4().hex[:8]}",
        headers={"Authorization": "Bearer tenant-a"},
        timeout=30,
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "session_not_found",
        "program_id",
        "invalid_request_error",
    )

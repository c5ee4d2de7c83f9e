"""The id the cluster keys a test client's program by: programs are scoped by
the caller's API key (`deployments.api.tenants.scoped_program_id`)."""

from __future__ import annotations

from cluster.policies.tenancy import scoped_program_id
from deployments.api.tenants import tenant_of

TEST_API_KEY = "test"
TEST_CLIENT_AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
"""Headers of a plain HTTP request made as the tests' `openai` client."""


def cluster_program_id(program: str, api_key: str = TEST_API_KEY) -> str:
    return scoped_program_id(tenant_of(f"Bearer {api_key}"), program)

"""Per-tenant quotas at the API: requests per second and programs at once."""

from __future__ import annotations

from cluster.policies.tenant_quotas import QuotaLimits, TenantQuotas
from deployments.errors import retry_after_header


def quotas(
    requests_per_s: float | None = None, burst: int = 2, max_programs: int | None = None
) -> TenantQuotas:
    return TenantQuotas(
        QuotaLimits(requests_per_s, burst, max_programs), programs_retry_after_s=5.0
    )


def admitted(policy: TenantQuotas, tenant: str, now: float) -> bool:
    return policy.admit(tenant, now, new_program=False, running_programs=0) is None


def test_without_quotas_everything_passes() -> None:
    policy = quotas()
    assert all(
        policy.admit("a", 0.0, new_program=True, running_programs=10**6) is None
        for _ in range(1000)
    )


def test_a_burst_passes_then_requests_pass_at_the_rate() -> None:
    policy = quotas(requests_per_s=2.0, burst=2)
    assert admitted(policy, "a", 0.0) and admitted(policy, "a", 0.0)
    refusal = policy.admit("a", 0.0, new_program=False, running_programs=0)
    assert refusal is not None and refusal.quota == "requests_per_s"
    assert refusal.retry_after_s == 0.5
    assert retry_after_header(refusal.retry_after_s) == "1"
    assert not admitted(policy, "a", 0.25)
    assert admitted(policy, "a", 0.5)


def test_one_tenants_traffic_does_not_use_anothers_tokens() -> None:
    policy = quotas(requests_per_s=1.0, burst=1)
    assert admitted(policy, "a", 0.0)
    assert not admitted(policy, "a", 0.0)
    assert admitted(policy, "b", 0.0)


def test_a_refused_request_uses_no_token() -> None:
    policy = quotas(requests_per_s=1.0, burst=1, max_programs=1)
    assert policy.admit("a", 0.0, new_program=True, running_programs=1) is not None
    assert admitted(policy, "a", 0.0)


def test_new_programs_wait_while_the_tenant_runs_its_maximum() -> None:
    policy = quotas(max_programs=2)
    refusal = policy.admit("a", 0.0, new_program=True, running_programs=2)
    assert refusal is not None and refusal.quota == "programs"
    assert refusal.retry_after_s == 5.0
    # Turns of programs already running go on; a new one once one ended.
    assert policy.admit("a", 0.0, new_program=False, running_programs=2) is None
    assert policy.admit("a", 0.0, new_program=True, running_programs=1) is None


def test_a_bucket_idle_long_enough_is_full_again() -> None:
    policy = quotas(requests_per_s=1.0, burst=3)
    for _ in range(3):
        assert admitted(policy, "a", 0.0)
    assert not admitted(policy, "a", 0.0)
    assert all(admitted(policy, "a", 100.0) for _ in range(3))
    assert not admitted(policy, "a", 100.0)


def test_a_tenant_with_limits_of_its_own_gets_them_instead_of_the_default() -> None:
    policy = TenantQuotas(
        QuotaLimits(requests_per_s=None),
        programs_retry_after_s=5.0,
        by_tenant={"small": QuotaLimits(requests_per_s=1.0, burst=1, max_programs=1)},
    )
    assert admitted(policy, "small", 0.0)
    assert not admitted(policy, "small", 0.0)
    assert policy.admit("small", 9.0, new_program=True, running_programs=1) is not None
    assert all(admitted(policy, "anyone", 0.0) for _ in range(100))

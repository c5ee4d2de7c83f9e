"""Pure: per-tenant quotas at the API. Each tenant gets a token bucket of
requests (`requests_per_s`, up to `burst` at once) and a cap on the programs it
runs at once, its own limits or the default; a refusal names the quota and when
a retry may pass."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class QuotaLimits:
    requests_per_s: float | None = None
    burst: int = 20
    max_programs: int | None = None


@dataclass(frozen=True)
class QuotaRefusal:
    quota: str
    """`requests_per_s` or `programs`."""
    message: str
    retry_after_s: float


class TenantQuotas:
    """Buckets of the `max_tenants` most recently seen tenants (an older tenant's
    returns full)."""

    def __init__(
        self,
        default: QuotaLimits,
        *,
        programs_retry_after_s: float,
        by_tenant: dict[str, QuotaLimits] | None = None,
        max_tenants: int = 100_000,
    ):
        self._default = default
        self._by_tenant = by_tenant or {}
        self._programs_retry_after_s = programs_retry_after_s
        self._max_tenants = max_tenants
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def admit(
        self, tenant: str, now: float, *, new_program: bool, running_programs: int
    ) -> QuotaRefusal | None:
        """A request of `tenant` at `now`; `new_program`: its program is not running
        yet, while the tenant runs `running_programs`. None: it may go on (and
        used a token)."""
        limits = self._by_tenant.get(tenant, self._default)
        if (
            new_program
            and limits.max_programs is not None
            and running_programs >= limits.max_programs
        ):
            return QuotaRefusal(
                "programs",
                f"Rate limit reached: {limits.max_programs} programs running at once; "
                "end one (DELETE /v1/sessions/{id} or a last-step turn) or retry later.",
                self._programs_retry_after_s,
            )
        rate = limits.requests_per_s
        if rate is None:
            return None
        burst = float(limits.burst)
        tokens, last = self._buckets.pop(tenant, (burst, now))
        tokens = min(burst, tokens + max(now - last, 0.0) * rate)
        refusal = None
        if tokens < 1:
            wait_s = (1 - tokens) / rate
            refusal = QuotaRefusal(
                "requests_per_s",
                f"Rate limit reached for requests: {rate:g} per second. "
                f"Please try again in {wait_s:.3g}s.",
                wait_s,
            )
        else:
            tokens -= 1
        self._buckets[tenant] = (tokens, now)
        while len(self._buckets) > self._max_tenants:
            self._buckets.popitem(last=False)
        return refusal

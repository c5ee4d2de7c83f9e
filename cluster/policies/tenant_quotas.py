"""Pure: per-tenant quotas at the API. Each tenant gets a token bucket of
requests (`requests_per_s`, up to `burst` at once) and a cap on the programs it
runs at once; a refusal names the quota and when a retry may pass."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


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
        *,
        requests_per_s: float | None,
        burst: int,
        max_programs: int | None,
        programs_retry_after_s: float,
        max_tenants: int = 100_000,
    ):
        self._requests_per_s = requests_per_s
        self._burst = float(burst)
        self._max_programs = max_programs
        self._programs_retry_after_s = programs_retry_after_s
        self._max_tenants = max_tenants
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def admit(
        self, tenant: str, now: float, *, new_program: bool, running_programs: int
    ) -> QuotaRefusal | None:
        """A request of `tenant` at `now`; `new_program`: its program is not running
        yet, while the tenant runs `running_programs`. None: it may go on (and
        used a token)."""
        if (
            new_program
            and self._max_programs is not None
            and running_programs >= self._max_programs
        ):
            return QuotaRefusal(
                "programs",
                f"Rate limit reached: {self._max_programs} programs running at once; "
                "end one (DELETE /v1/sessions/{id} or a last-step turn) or retry later.",
                self._programs_retry_after_s,
            )
        if self._requests_per_s is None:
            return None
        tokens, last = self._buckets.pop(tenant, (self._burst, now))
        tokens = min(self._burst, tokens + max(now - last, 0.0) * self._requests_per_s)
        refusal = None
        if tokens < 1:
            wait_s = (1 - tokens) / self._requests_per_s
            refusal = QuotaRefusal(
                "requests_per_s",
                f"Rate limit reached for requests: {self._requests_per_s:g} per second. "
                f"Please try again in {wait_s:.3g}s.",
                wait_s,
            )
        else:
            tokens -= 1
        self._buckets[tenant] = (tokens, now)
        while len(self._buckets) > self._max_tenants:
            self._buckets.popitem(last=False)
        return refusal

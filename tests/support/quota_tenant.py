"""The end-to-end cluster's one tenant with quotas of its own."""

from __future__ import annotations

from cluster.config import TenantQuotaLimits

QUOTA_TENANT_KEY = "e2e-quota-tenant"
QUOTA_TENANT_LIMITS = TenantQuotaLimits(requests_per_s=0.2, burst=2, max_programs=1)

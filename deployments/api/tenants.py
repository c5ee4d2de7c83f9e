"""Who is calling: the tenant an API key names, whether the key is accepted, and
what a tenant scopes (program ids, the engine's prefix cache)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster.config import TenantQuotaConfig, TenantQuotaLimits
from cluster.policies.tenancy import ANONYMOUS_TENANT, key_tenant
from cluster.policies.tenant_quotas import QuotaLimits, TenantQuotas
from deployments.errors import ApiError, RequestRejected

_BEARER = "bearer "


def _key_of(authorization: str | None) -> str | None:
    if not authorization:
        return None
    if authorization[: len(_BEARER)].lower() == _BEARER:
        authorization = authorization[len(_BEARER) :]
    return authorization.strip() or None


def key_digest(key: str) -> str:
    """What the cluster keeps of an API key: never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()


def tenant_of(authorization: str | None) -> str:
    """The tenant of an `Authorization` header: callers are told apart by their
    API key (its digest), callers without one are one anonymous tenant."""
    key = _key_of(authorization)
    return ANONYMOUS_TENANT if key is None else key_tenant(key_digest(key))


def cache_salt(tenant: str, client_salt: str | None, shared_prefix_cache: bool) -> str | None:
    """The `cache_salt` the engine hashes a request's prefix blocks with. Unless
    the prefix cache is shared, each keyed tenant's blocks are its own: no other
    tenant's request can hit them (and time the hit to learn the prompt). A
    client's own salt is kept inside its tenant's, so it cannot name another's.
    Anonymous callers without a salt stay unsalted, as on vLLM's own server."""
    if shared_prefix_cache:
        return client_salt
    if client_salt is None:
        return None if tenant == ANONYMOUS_TENANT else tenant
    # A digest keeps the pair within vLLM's 128 characters and its allowed set.
    return f"{tenant}:{key_digest(client_salt)[:32]}"


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_api_key")


@dataclass(frozen=True)
class ApiKeys:
    """The API keys the server accepts, as digests; none: every caller is served
    (its key, if any, still names its tenant)."""

    digests: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Iterable[str]) -> ApiKeys:
        return cls(frozenset(key_digest(key) for key in keys))

    @property
    def required(self) -> bool:
        return bool(self.digests)

    def tenant(self, authorization: str | None) -> str:
        """The caller's tenant; raises RequestRejected (401) for a missing or
        unknown key when keys are required."""
        if self.required:
            key = _key_of(authorization)
            if key is None:
                raise RequestRejected(
                    unauthorized(
                        "You didn't provide an API key. Send it in an Authorization "
                        "header using Bearer auth (Authorization: Bearer YOUR_KEY)."
                    )
                )
            if key_digest(key) not in self.digests:
                raise RequestRejected(unauthorized(f"Incorrect API key provided: {_masked(key)}."))
        return tenant_of(authorization)


def _masked(key: str) -> str:
    return key[:3] + "*" * min(max(len(key) - 7, 0), 12) + key[-4:] if len(key) > 8 else "***"


@dataclass(frozen=True)
class Tenancy:
    """What the ingress needs of the `server` configuration to tell callers apart."""

    api_keys: ApiKeys
    shared_prefix_cache: bool
    session_ttl_s: float
    quotas: TenantQuotaConfig = field(default_factory=TenantQuotaConfig)


def tenant_quotas(config: TenantQuotaConfig) -> TenantQuotas:
    def limits(of: TenantQuotaLimits) -> QuotaLimits:
        return QuotaLimits(of.requests_per_s, of.burst, of.max_programs)

    return TenantQuotas(
        limits(config),
        programs_retry_after_s=config.programs_retry_after_s,
        by_tenant={tenant: limits(own) for tenant, own in config.tenants.items()},
    )

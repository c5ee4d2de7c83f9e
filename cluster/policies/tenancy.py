"""Program ids as the cluster keys them: scoped by the caller's tenant (pure)."""

from __future__ import annotations

ANONYMOUS_TENANT = "anonymous"
_SCOPE_SEPARATOR = "/"
_KEY_TENANT_PREFIX = "key-"
_KEY_TENANT_DIGITS = 24


def key_tenant(key_digest: str) -> str:
    """The tenant an API key names, from its hex digest."""
    return _KEY_TENANT_PREFIX + key_digest[:_KEY_TENANT_DIGITS]


def scoped_program_id(tenant: str, program_id: str) -> str:
    """The program id the cluster keys a caller's program by (pins, TTL ledger,
    program FCFS, routing, tool state): the same id from two API keys names two
    programs, so one key can neither join nor end another's program. Callers
    without a key share one namespace, their ids as sent (but for an id that
    would pass for a keyed tenant's, which is scoped as the anonymous tenant's)."""
    if tenant == ANONYMOUS_TENANT and not _names_key_tenant(program_id):
        return program_id
    return f"{tenant}{_SCOPE_SEPARATOR}{program_id}"


def unscoped_program_id(tenant: str, scoped_id: str) -> str:
    """The id the caller sent, of a program id `scoped_program_id` made."""
    unscoped = scoped_id.removeprefix(f"{tenant}{_SCOPE_SEPARATOR}")
    if tenant == ANONYMOUS_TENANT and not _names_key_tenant(unscoped):
        return scoped_id
    return unscoped


def program_tenant(scoped_id: str) -> str:
    """The tenant of a program id `scoped_program_id` made."""
    tenant = scoped_id.partition(_SCOPE_SEPARATOR)[0]
    return tenant if _names_key_tenant(scoped_id) else ANONYMOUS_TENANT


def _names_key_tenant(program_id: str) -> bool:
    tenant, separator, _ = program_id.partition(_SCOPE_SEPARATOR)
    return bool(separator) and _is_key_tenant(tenant)


def _is_key_tenant(name: str) -> bool:
    digits = name.removeprefix(_KEY_TENANT_PREFIX)
    return (
        name.startswith(_KEY_TENANT_PREFIX)
        and len(digits) == _KEY_TENANT_DIGITS
        and all(character in "0123456789abcdef" for character in digits)
    )

"""Each tenant's speculation ledger: one hash of counters (turns speculated on,
speculative runs issued, used and discarded by tool, the tool CPU and draft
tokens they cost), shared by every ingress replica, kept while the tenant keeps
speculating (`ttl_s` from its last entry). A ledger Redis cannot keep loses
that entry, never the turn."""

from __future__ import annotations

from cluster.store._redis import async_client, or_fallback, text

_PREFIX = "toolserve:speculation-ledger:"


class SpeculationLedger:
    """A store belongs to the event loop that first uses it."""

    def __init__(self, url: str, ttl_s: float):
        self._client = async_client(url)
        self._ttl_ms = max(1, int(ttl_s * 1000))

    async def add(self, tenant: str, increments: dict[str, int]) -> None:
        if not increments:
            return
        key = _PREFIX + tenant
        pipeline = self._client.pipeline(transaction=False)
        for field, amount in increments.items():
            pipeline.hincrby(key, field, amount)
        pipeline.pexpire(key, self._ttl_ms)
        await or_fallback(
            pipeline.execute(), None, f"cannot add to the speculation ledger of {tenant}"
        )

    async def read(self, tenant: str) -> dict[str, int] | None:
        """The tenant's counters ({} before any entry); None when Redis cannot answer."""
        stored = await or_fallback(
            self._client.hgetall(_PREFIX + tenant),
            None,
            f"cannot read the speculation ledger of {tenant}",
        )
        if stored is None:
            return None
        return {text(field): int(value) for field, value in stored.items()}

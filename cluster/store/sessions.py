"""The sessions the cluster knows: a program id (as the cluster keys it) is known
from its first turn or tool-state reset until it is ended or idle too long, so
ending an unknown session can answer 404."""

from __future__ import annotations

from cluster.store._redis import async_client, or_fallback

_PREFIX = "toolserve:session:"


class KnownSessions:
    """One expiring key per session. A store belongs to the event loop that
    first uses it."""

    def __init__(self, url: str):
        self._client = async_client(url)

    async def touch(self, program_id: str, idle_ttl_s: float) -> None:
        """The session had a turn (or a reset) now; when Redis cannot answer it
        goes unrecorded and a later end is served without the check."""
        await or_fallback(
            self._client.set(_PREFIX + program_id, 1, px=max(1, int(idle_ttl_s * 1000))),
            None,
            f"cannot record session {program_id}",
        )

    async def forget(self, program_id: str) -> bool | None:
        """Whether the session was known (and is no longer); None when Redis
        cannot answer."""
        removed = await or_fallback(
            self._client.delete(_PREFIX + program_id), None, f"cannot end session {program_id}"
        )
        return None if removed is None else removed > 0

    async def close(self) -> None:
        await self._client.aclose()

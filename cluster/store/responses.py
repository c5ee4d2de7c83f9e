"""Who each chat completion belongs to, so only its tenant may post tool outputs
for it (`/cache-tool-output`), cached in its program's scope."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cluster.store._redis import async_client, or_fallback

_PREFIX = "toolserve:response:"


@dataclass(frozen=True)
class ResponseOwner:
    response_id: str
    tenant: str
    program_id: str


class ResponseOwners:
    """Owners set once per response id and expiring. A store belongs to the event
    loop that first uses it."""

    def __init__(self, url: str):
        self._client = async_client(url)

    async def record(self, owner: ResponseOwner, ttl_s: float) -> bool:
        """Remembers who asked for a response, unless someone else already did
        (a client-chosen request id cannot take over another's response)."""
        stored = await or_fallback(
            self._client.set(
                _PREFIX + owner.response_id,
                json.dumps(asdict(owner)),
                px=max(1, int(ttl_s * 1000)),
                nx=True,
            ),
            False,
            f"cannot record response {owner.response_id}",
        )
        return bool(stored)

    async def owner(self, response_id: str) -> ResponseOwner | None:
        """Raises when Redis cannot answer (`_redis.UNREACHABLE`)."""
        raw = await self._client.get(_PREFIX + response_id)
        return None if raw is None else ResponseOwner(**json.loads(raw))

    async def close(self) -> None:
        await self._client.aclose()

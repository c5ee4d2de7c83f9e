"""The one module that talks to Redis. Every call degrades to "no answer" when
Redis is unreachable; callers never fail because the store is down."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger("toolserve.store")

_SOCKET_TIMEOUT_S = 0.5


class ClusterStore:
    """Cluster-wide state in Redis."""

    def __init__(self, url: str):
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=_SOCKET_TIMEOUT_S,
            socket_connect_timeout=_SOCKET_TIMEOUT_S,
        )

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError) as error:
            logger.warning("redis unreachable: %s", error)
            return False

    async def close(self) -> None:
        await self._client.aclose()

"""Redis clients and the log-and-degrade path every degrading store shares."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger("toolserve.store")

SOCKET_TIMEOUT_S = 0.5
UNREACHABLE = (RedisError, OSError)
"""What a Redis call raises when the server cannot answer."""

Result = TypeVar("Result")

EVICT_PAST_BOUND_LUA = """
local function evict_past_bound(index, bound, entry_prefix)
  local excess = redis.call('ZCARD', index) - tonumber(bound)
  if excess > 0 then
    local evicted = redis.call('ZPOPMIN', index, excess)
    for i = 1, #evicted, 2 do redis.call('DEL', entry_prefix .. evicted[i]) end
  end
end
"""
"""A Lua function for store scripts: the lowest-scored members of a sorted-set
index past `bound` leave it, and their entries (`entry_prefix` + member) go."""


def async_client(url: str, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """A client for one event loop: the loop that first uses it."""
    return aioredis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=SOCKET_TIMEOUT_S
    )


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
    )


async def or_fallback(operation: Awaitable[Result], fallback: Result, failure: str) -> Result:
    """The operation's result, or `fallback` (with `failure` logged) when Redis
    cannot answer."""
    try:
        return await operation
    except UNREACHABLE as error:
        logger.warning("%s: %s", failure, error)
        return fallback


def sync_or_fallback(operation: Callable[[], Result], fallback: Result, failure: str) -> Result:
    try:
        return operation()
    except UNREACHABLE as error:
        logger.warning("%s: %s", failure, error)
        return fallback


def text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

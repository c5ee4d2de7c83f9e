"""The global tool cache: one entry per canonical tool call (see
`toolworkers.cache_keys`), one execution per key across the cluster."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from cluster.store._redis import EVICT_PAST_BOUND_LUA, async_client, or_fallback, text


@dataclass(frozen=True)
class CachedToolResult:
    """A tool-cache entry: `pending` while a call runs, then `done` or `error`."""

    state: str
    output: str
    error_kind: str | None
    origin: str = ""
    duration_s: float = 0.0


@dataclass(frozen=True)
class ToolCacheClaim:
    """The answer to "may I run this call?": yes (`claimed`, with the token that
    proves it when completing), or the entry someone else holds."""

    claimed: bool
    token: str
    existing: CachedToolResult | None


_TOOL_CACHE_ENTRY_PREFIX = "toolserve:tool-cache:entry:"
_TOOL_CACHE_INDEX = "toolserve:tool-cache:index"

_CLAIM_TOOL_CALL = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[1], 'origin', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'claimed'}
end
return {state, redis.call('HGET', KEYS[1], 'output') or '',
        redis.call('HGET', KEYS[1], 'error_kind') or '',
        redis.call('HGET', KEYS[1], 'origin') or '',
        redis.call('HGET', KEYS[1], 'duration_s') or '0'}
"""

# Stores a result unless a completed one is already there (first result wins) or,
# for an executor's result, another executor now holds the key. A client-posted
# result (empty token) always wins: the client ran its own tool. The index keeps
# every entry by expiry so the soonest to expire are evicted past the bound.
_COMPLETE_TOOL_CALL = (
    EVICT_PAST_BOUND_LUA
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if ARGV[1] ~= '' then
  if state == 'done' then return 0 end
  if state == 'pending' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'output', ARGV[3], 'error_kind', ARGV[4],
           'origin', ARGV[10], 'duration_s', ARGV[11])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local now = tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[8])
evict_past_bound(KEYS[2], ARGV[7], ARGV[9])
return 1
"""
)


class ToolCache:
    """Redis being down reads as "nothing cached" and every claim succeeds, so
    calls still run (without sharing).
    """

    def __init__(self, url: str, max_entries: int):
        self._client = async_client(url)
        self._max_entries = max_entries
        self._claim = self._client.register_script(_CLAIM_TOOL_CALL)
        self._complete = self._client.register_script(_COMPLETE_TOOL_CALL)

    async def claim(self, key: str, lease_s: float, origin: str = "") -> ToolCacheClaim:
        """`origin` says who runs the call (e.g. a speculation), for whoever uses it."""
        token = uuid.uuid4().hex
        reply = await or_fallback(
            self._claim(
                keys=[_TOOL_CACHE_ENTRY_PREFIX + key], args=[token, int(lease_s * 1000), origin]
            ),
            ["claimed"],
            f"tool cache: cannot claim {key}",
        )
        values = [text(value) for value in reply]
        if values[0] == "claimed":
            return ToolCacheClaim(True, token, None)
        existing = CachedToolResult(
            values[0], values[1], values[2] or None, values[3], float(values[4] or 0)
        )
        return ToolCacheClaim(False, "", existing)

    async def complete(
        self,
        key: str,
        token: str,
        result: CachedToolResult,
        keep_alive_s: float,
    ) -> bool:
        """Stores a finished call's result; `token` from the claim, or "" for a
        result a client posted. False when not stored (see the script above)."""
        stored = await or_fallback(
            self._complete(
                keys=[_TOOL_CACHE_ENTRY_PREFIX + key, _TOOL_CACHE_INDEX],
                args=[
                    token,
                    result.state,
                    result.output,
                    result.error_kind or "",
                    max(1, int(keep_alive_s * 1000)),
                    int(time.time() * 1000),
                    self._max_entries,
                    key,
                    _TOOL_CACHE_ENTRY_PREFIX,
                    result.origin,
                    result.duration_s,
                ],
            ),
            False,
            f"tool cache: cannot store {key}",
        )
        return bool(stored)

    async def get(self, key: str) -> CachedToolResult | None:
        raw = await or_fallback(
            self._client.hgetall(_TOOL_CACHE_ENTRY_PREFIX + key),
            None,
            f"tool cache: cannot read {key}",
        )
        if not raw:
            return None
        fields = {text(name): text(value) for name, value in raw.items()}
        return CachedToolResult(
            fields.get("state", "pending"),
            fields.get("output", ""),
            fields.get("error_kind") or None,
            fields.get("origin", ""),
            float(fields.get("duration_s") or 0),
        )

    async def wait(
        self, key: str, timeout_s: float, *, absent_is_final: bool = True
    ) -> CachedToolResult | None:
        """The entry once it is no longer pending; None when `timeout_s` passed
        first or, with `absent_is_final`, when there is no entry (its runner's
        lease expired) rather than waiting for one to appear."""
        deadline = time.monotonic() + timeout_s
        pause_s = 0.005
        while True:
            entry = await self.get(key)
            if entry is None and absent_is_final:
                return None
            if entry is not None and entry.state != "pending":
                return entry
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(pause_s, remaining))
            pause_s = min(pause_s * 2, 0.05)

    async def close(self) -> None:
        await self._client.aclose()

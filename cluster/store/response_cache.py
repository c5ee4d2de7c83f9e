"""The response cache: a chat completion's reply stored under the digest of its
request, so an exact repeat is answered without engine work. Bounded by a count
of entries, least recently used evicted first; every ingress replica shares it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from cluster.store._redis import EVICT_PAST_BOUND_LUA, async_client, or_fallback

_ENTRY_PREFIX = "toolserve:response-cache:entry:"
_INDEX = "toolserve:response-cache:index"

# Reads an entry and marks it used (its index score is its last use), in one trip.
_READ_REPLY = """
local stored = redis.call('GET', KEYS[1])
if not stored then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return false
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return stored
"""

# Stores an entry; past the bound the least recently used go, and index members
# whose entry expired (unused for the whole TTL) are dropped first. The index
# itself expires with its most recently used entry.
_STORE_REPLY = (
    EVICT_PAST_BOUND_LUA
    + """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], now, ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
evict_past_bound(KEYS[2], ARGV[5], ARGV[6])
return 1
"""
)


@dataclass(frozen=True)
class StoredReply:
    """A reply as the client received it: a JSON body, or a stream's chunk
    payloads in order. `request_chars` is the length of the canonical request it
    answered: a lookup whose request differs in length is a digest collision."""

    request_chars: int
    streamed: bool
    body: dict[str, Any] | None = None
    chunks: tuple[dict[str, Any], ...] = ()

    def encode(self) -> str:
        return json.dumps(
            {
                "request_chars": self.request_chars,
                "streamed": self.streamed,
                "body": self.body,
                "chunks": list(self.chunks),
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> StoredReply:
        fields = json.loads(raw)
        return cls(
            int(fields["request_chars"]),
            bool(fields["streamed"]),
            fields.get("body"),
            tuple(fields.get("chunks") or ()),
        )


class ResponseCache:
    """Redis being down reads as an empty cache and stores nothing, so every
    request is served by the engine. A store belongs to the event loop that
    first uses it."""

    def __init__(self, url: str, max_entries: int, ttl_s: float, max_entry_bytes: int):
        self._client = async_client(url)
        self._max_entries = max_entries
        self._max_entry_bytes = max_entry_bytes
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._read = self._client.register_script(_READ_REPLY)
        self._store = self._client.register_script(_STORE_REPLY)

    async def lookup(self, digest: str, request_chars: int) -> StoredReply | None:
        """The reply stored for a request, if one is and it answered a request of
        the same length; using it keeps it for another TTL."""
        raw = await or_fallback(
            self._read(
                keys=[_ENTRY_PREFIX + digest, _INDEX],
                args=[digest, int(time.time() * 1000), self._ttl_ms],
            ),
            None,
            "response cache: cannot read",
        )
        if raw is None:
            return None
        reply = StoredReply.decode(raw)
        return reply if reply.request_chars == request_chars else None

    async def store(self, digest: str, reply: StoredReply) -> bool:
        """False when not stored: larger than an entry may be, or Redis down."""
        encoded = reply.encode()
        if len(encoded) > self._max_entry_bytes:
            return False
        stored = await or_fallback(
            self._store(
                keys=[_ENTRY_PREFIX + digest, _INDEX],
                args=[
                    encoded,
                    self._ttl_ms,
                    int(time.time() * 1000),
                    digest,
                    self._max_entries,
                    _ENTRY_PREFIX,
                ],
            ),
            False,
            "response cache: cannot store",
        )
        return bool(stored)

    async def close(self) -> None:
        await self._client.aclose()

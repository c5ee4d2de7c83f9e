"""The one module that talks to Redis. Every call degrades to "no answer" when
Redis is unreachable; callers never fail because the store is down."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import redis
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


@dataclass(frozen=True)
class LedgerEntry:
    """A program's KV pinned on a replica until `expires_at` (Unix seconds)."""

    program_id: str
    replica_id: str
    expires_at: float
    tokens: int
    tool: str | None


_LEDGER_PREFIX = "toolserve:ttl-ledger"

# Remove a program's entry only if this replica still owns it: another replica
# may have pinned the program's newer turn meanwhile.
_REMOVE_IF_OWNER = """
local raw = redis.call('GET', KEYS[1])
if raw and cjson.decode(raw)['replica_id'] == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
redis.call('SREM', KEYS[2], ARGV[2])
return 0
"""


def _program_key(program_id: str) -> str:
    return f"{_LEDGER_PREFIX}:program:{program_id}"


def _replica_key(replica_id: str) -> str:
    return f"{_LEDGER_PREFIX}:replica:{replica_id}"


class TtlLedger:
    """Which replica holds a program's pinned KV, and until when.

    Synchronous: engines publish from a background thread. Entries expire in
    Redis at the pin's expiry, so a crashed replica's entries vanish on their own.
    """

    def __init__(self, url: str):
        self._client = redis.Redis.from_url(
            url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S
        )
        self._remove_if_owner = self._client.register_script(_REMOVE_IF_OWNER)

    def put(self, entry: LedgerEntry) -> bool:
        try:
            pipeline = self._client.pipeline(transaction=True)
            pipeline.set(
                _program_key(entry.program_id),
                json.dumps(asdict(entry)),
                pxat=int(entry.expires_at * 1000),
            )
            pipeline.sadd(_replica_key(entry.replica_id), entry.program_id)
            pipeline.execute()
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot publish pin of %s: %s", entry.program_id, error)
            return False
        return True

    def remove(self, program_id: str, replica_id: str) -> bool:
        try:
            self._remove_if_owner(
                keys=[_program_key(program_id), _replica_key(replica_id)],
                args=[replica_id, program_id],
            )
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot withdraw pin of %s: %s", program_id, error)
            return False
        return True

    def lookup(self, program_id: str) -> LedgerEntry | None:
        try:
            raw = self._client.get(_program_key(program_id))
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot look up %s: %s", program_id, error)
            return None
        return None if raw is None else LedgerEntry(**json.loads(raw))

    def clear_replica(self, replica_id: str) -> int:
        """Drop every entry a replica owns (on start, shutdown, or its death)."""
        try:
            members = self._client.smembers(_replica_key(replica_id))
            program_ids = [
                member.decode() if isinstance(member, bytes) else member for member in members
            ]
            for program_id in program_ids:
                self._remove_if_owner(
                    keys=[_program_key(program_id), _replica_key(replica_id)],
                    args=[replica_id, program_id],
                )
            self._client.delete(_replica_key(replica_id))
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot clear replica %s: %s", replica_id, error)
            return 0
        return len(program_ids)

    def close(self) -> None:
        self._client.close()

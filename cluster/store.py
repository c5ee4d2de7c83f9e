"""The one module that talks to Redis. Every call degrades to "no answer" when
Redis is unreachable; callers never fail because the store is down."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger("toolserve.store")

_SOCKET_TIMEOUT_S = 0.5


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

# Drop every entry a replica still owns, and its index; returns how many it owned.
_CLEAR_REPLICA = """
local programs = redis.call('SMEMBERS', KEYS[1])
for _, program_id in ipairs(programs) do
  local key = ARGV[1] .. program_id
  local raw = redis.call('GET', key)
  if raw and cjson.decode(raw)['replica_id'] == ARGV[2] then
    redis.call('DEL', key)
  end
end
redis.call('DEL', KEYS[1])
return #programs
"""

_PINNING_CONTROL_CHANNEL = "toolserve:pinning-control"


_PROGRAM_KEY_PREFIX = f"{_LEDGER_PREFIX}:program:"


def _program_key(program_id: str) -> str:
    return _PROGRAM_KEY_PREFIX + program_id


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
        self._clear_replica = self._client.register_script(_CLEAR_REPLICA)

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
        """Drop every entry a replica owns (on its start and shutdown)."""
        try:
            owned = self._clear_replica(
                keys=[_replica_key(replica_id)], args=[_PROGRAM_KEY_PREFIX, replica_id]
            )
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot clear replica %s: %s", replica_id, error)
            return 0
        return int(owned)

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class PinningControl:
    """A request to main-model replicas: `end_program` (the client closed the
    session) or `release_pin` (the router moved the program elsewhere).
    `replica_id` None addresses every replica."""

    operation: str
    program_id: str
    replica_id: str | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    """A model replica's own report of its engine, refreshed while it lives."""

    replica_id: str
    role: str
    model: str
    state: str
    detail: str


_REPLICA_STATUS_PREFIX = "toolserve:replica-status:"


class ClusterStore:
    """Cluster-wide state in Redis, for asyncio code (ingress, router, replicas).

    A client belongs to the event loop that first uses it: create one per loop.
    """

    def __init__(self, url: str):
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=_SOCKET_TIMEOUT_S,
            socket_connect_timeout=_SOCKET_TIMEOUT_S,
        )
        self._remove_if_owner = self._client.register_script(_REMOVE_IF_OWNER)
        self._clear_replica = self._client.register_script(_CLEAR_REPLICA)

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError) as error:
            logger.warning("redis unreachable: %s", error)
            return False

    async def lookup_pin(self, program_id: str) -> LedgerEntry | None:
        """The program's TTL-ledger entry; raises RedisError or OSError when Redis
        cannot answer, so a caller can tell "no pin" from "unknown"."""
        raw = await self._client.get(_program_key(program_id))
        return None if raw is None else LedgerEntry(**json.loads(raw))

    async def drop_pin(self, program_id: str, replica_id: str) -> None:
        try:
            await self._remove_if_owner(
                keys=[_program_key(program_id), _replica_key(replica_id)],
                args=[replica_id, program_id],
            )
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot drop pin of %s: %s", program_id, error)

    async def clear_replica_pins(self, replica_id: str) -> int:
        try:
            owned = await self._clear_replica(
                keys=[_replica_key(replica_id)], args=[_PROGRAM_KEY_PREFIX, replica_id]
            )
        except (RedisError, OSError) as error:
            logger.warning("ttl ledger: cannot clear replica %s: %s", replica_id, error)
            return 0
        return int(owned)

    async def send_pinning_control(self, message: PinningControl) -> int:
        """Publishes to the replicas; returns how many replicas listened (0 when
        Redis is unreachable, so the caller can fall back)."""
        try:
            listeners = await self._client.publish(
                _PINNING_CONTROL_CHANNEL, json.dumps(asdict(message))
            )
        except (RedisError, OSError) as error:
            logger.warning("cannot publish %s: %s", message, error)
            return 0
        return int(listeners)

    async def pinning_control_messages(self, retry_s: float = 2.0) -> AsyncIterator[PinningControl]:
        """Every message on the pinning control channel, resubscribing after Redis
        outages (messages sent meanwhile are lost; pins expire by their TTL)."""
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(_PINNING_CONTROL_CHANNEL)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    try:
                        yield PinningControl(**json.loads(message["data"]))
                    except (TypeError, ValueError) as error:
                        logger.warning("ignoring malformed pinning control: %s", error)
            except (RedisError, OSError) as error:
                logger.warning("pinning control channel lost: %s; resubscribing", error)
                await asyncio.sleep(retry_s)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def announce_replica(
        self, deployment_id: str, status: ReplicaStatus, ttl_s: float
    ) -> None:
        try:
            await self._client.set(
                f"{_REPLICA_STATUS_PREFIX}{deployment_id}:{status.replica_id}",
                json.dumps(asdict(status)),
                px=int(ttl_s * 1000),
            )
        except (RedisError, OSError) as error:
            logger.warning("cannot announce replica %s: %s", status.replica_id, error)

    async def replica_statuses(self, deployment_id: str) -> list[ReplicaStatus] | None:
        """The last report of every live replica of one deployment of toolserve (one
        `toolserve up`); None when Redis cannot answer."""
        pattern = f"{_REPLICA_STATUS_PREFIX}{deployment_id}:*"
        try:
            keys = [key async for key in self._client.scan_iter(pattern)]
            values = await self._client.mget(keys) if keys else []
        except (RedisError, OSError) as error:
            logger.warning("cannot read replica statuses: %s", error)
            return None
        return [ReplicaStatus(**json.loads(raw)) for raw in values if raw is not None]

    async def close(self) -> None:
        await self._client.aclose()

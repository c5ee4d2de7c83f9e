"""The one module that talks to Redis. Every call degrades to "no answer" when
Redis is unreachable; callers never fail because the store is down, except for
stateful tools' state, which is never silently dropped (`RedisToolStateStore`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolworkers.tool_state import SlotContents, ToolStateUnavailable

logger = logging.getLogger("toolserve.store")

_SOCKET_TIMEOUT_S = 0.5
# A stateful call cannot run without its state (the cache and ledger can be
# skipped), so a Redis slowed by a loaded machine is waited for, not a failure.
_STATE_SOCKET_TIMEOUT_S = 5.0


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


_RESPONSE_PREFIX = "toolserve:response:"


@dataclass(frozen=True)
class ResponseOwner:
    """Who a chat completion belongs to: its tenant may post tool outputs for it,
    cached in its program's scope."""

    response_id: str
    tenant: str
    program_id: str


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

    async def record_response(self, owner: ResponseOwner, ttl_s: float) -> bool:
        """Remembers who asked for a response, unless someone else already did
        (a client-chosen request id cannot take over another's response)."""
        try:
            return bool(
                await self._client.set(
                    _RESPONSE_PREFIX + owner.response_id,
                    json.dumps(asdict(owner)),
                    px=max(1, int(ttl_s * 1000)),
                    nx=True,
                )
            )
        except (RedisError, OSError) as error:
            logger.warning("cannot record response %s: %s", owner.response_id, error)
            return False

    async def response_owner(self, response_id: str) -> ResponseOwner | None:
        """Raises RedisError or OSError when Redis cannot answer."""
        raw = await self._client.get(_RESPONSE_PREFIX + response_id)
        return None if raw is None else ResponseOwner(**json.loads(raw))

    async def close(self) -> None:
        await self._client.aclose()


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
_COMPLETE_TOOL_CALL = """
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
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if excess > 0 then
  local evicted = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #evicted, 2 do redis.call('DEL', ARGV[9] .. evicted[i]) end
end
return 1
"""


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ToolCache:
    """The global tool cache: one entry per canonical tool call (see
    `toolworkers.cache_keys`), one execution per key across the cluster.

    Redis being down reads as "nothing cached" and every claim succeeds, so
    calls still run (without sharing).
    """

    def __init__(self, url: str, max_entries: int):
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S
        )
        self._max_entries = max_entries
        self._claim = self._client.register_script(_CLAIM_TOOL_CALL)
        self._complete = self._client.register_script(_COMPLETE_TOOL_CALL)

    async def claim(self, key: str, lease_s: float, origin: str = "") -> ToolCacheClaim:
        """`origin` says who runs the call (e.g. a speculation), for whoever uses it."""
        token = uuid.uuid4().hex
        try:
            reply = await self._claim(
                keys=[_TOOL_CACHE_ENTRY_PREFIX + key], args=[token, int(lease_s * 1000), origin]
            )
        except (RedisError, OSError) as error:
            logger.warning("tool cache: cannot claim %s: %s", key, error)
            return ToolCacheClaim(True, token, None)
        values = [_text(value) for value in reply]
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
        try:
            stored = await self._complete(
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
            )
        except (RedisError, OSError) as error:
            logger.warning("tool cache: cannot store %s: %s", key, error)
            return False
        return bool(stored)

    async def get(self, key: str) -> CachedToolResult | None:
        try:
            raw = await self._client.hgetall(_TOOL_CACHE_ENTRY_PREFIX + key)
        except (RedisError, OSError) as error:
            logger.warning("tool cache: cannot read %s: %s", key, error)
            return None
        if not raw:
            return None
        fields = {_text(name): _text(value) for name, value in raw.items()}
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


_TOOL_STATE_PREFIX = "toolserve:tool-state:"
_TOOL_STATE_LOCK_PREFIX = "toolserve:tool-state-lock:"
_RELEASE_IF_HOLDER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisToolStateStore:
    """Stateful tools' slots (see `toolworkers.tool_state`): one hash per tenant and
    program (`value:<slot>`, `scenario:<slot>`), kept `ttl_s` after its last write,
    and a lock with a lease per program. Redis being down fails the call that needs
    the state (`ToolStateUnavailable`) rather than run it on a state it cannot keep."""

    def __init__(self, url: str, ttl_s: float):
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=_STATE_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S
        )
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._release = self._client.register_script(_RELEASE_IF_HOLDER)

    @staticmethod
    def _key(tenant: str, program_id: str) -> str:
        return f"{_TOOL_STATE_PREFIX}{tenant}:{program_id}"

    @contextlib.asynccontextmanager
    async def hold(self, tenant: str, program_id: str, lease_s: float) -> AsyncIterator[None]:
        lock_key = f"{_TOOL_STATE_LOCK_PREFIX}{tenant}:{program_id}"
        token = uuid.uuid4().hex
        deadline = time.monotonic() + lease_s
        pause_s = 0.005
        try:
            while not await self._client.set(lock_key, token, nx=True, px=int(lease_s * 1000)):
                if time.monotonic() >= deadline:
                    raise ToolStateUnavailable(f"program {program_id!r} is busy with another call")
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.05)
        except (RedisError, OSError) as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error
        try:
            yield
        finally:
            try:
                await self._release(keys=[lock_key], args=[token])
            except (RedisError, OSError) as error:
                logger.warning("tool state: lock of %s left to expire: %s", program_id, error)

    async def load(self, tenant: str, program_id: str, slot: str) -> SlotContents:
        try:
            value, scenario = await self._client.hmget(
                self._key(tenant, program_id), [f"value:{slot}", f"scenario:{slot}"]
            )
        except (RedisError, OSError) as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error
        return SlotContents(
            None if value is None else _text(value),
            None if scenario is None else json.loads(scenario),
        )

    async def _write(
        self, tenant: str, program_id: str, fields: dict[Any, str], dropped: tuple[str, ...] = ()
    ) -> None:
        key = self._key(tenant, program_id)
        try:
            async with self._client.pipeline(transaction=True) as pipeline:
                if dropped:
                    pipeline.hdel(key, *dropped)
                pipeline.hset(key, mapping=fields)
                pipeline.pexpire(key, self._ttl_ms)
                await pipeline.execute()
        except (RedisError, OSError) as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error

    async def save(self, tenant: str, program_id: str, slot: str, value: str) -> None:
        await self._write(tenant, program_id, {f"value:{slot}": value})

    async def set_scenario(self, tenant: str, program_id: str, slot: str, scenario: Any) -> None:
        await self._write(
            tenant, program_id, {f"scenario:{slot}": json.dumps(scenario)}, (f"value:{slot}",)
        )

    async def clear(self, tenant: str, program_id: str) -> None:
        try:
            await self._client.delete(self._key(tenant, program_id))
        except (RedisError, OSError) as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error

    async def close(self) -> None:
        await self._client.aclose()

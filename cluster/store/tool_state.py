"""Where stateful tools' per-program state lives (see `toolworkers.tool_state` for
what a tool sees): Redis in a cluster, the process's memory without one.

The only store that fails rather than degrades (`ToolStateUnavailable`): a call
never runs on state it cannot keep."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from cluster.store._redis import UNREACHABLE, async_client, logger, text

# A stateful call cannot run without its state (the cache and ledger can be
# skipped), so a Redis slowed by a loaded machine is waited for, not a failure.
_STATE_SOCKET_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SlotContents:
    """A slot as stored: `value` encoded by `encode_value` (None before any call)
    and the scenario (JSON, None if the client set none)."""

    value: str | None
    scenario: Any

    def version(self) -> str:
        """Names these contents: equal contents, equal versions. A call that changes
        the slot changes its version, so a result computed on one version is never
        taken for another."""
        payload = json.dumps([self.value, self.scenario], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


class ToolStateUnavailable(Exception):
    """The state could not be read, locked or stored (the store is down or busy)."""


class ToolStateStore(Protocol):
    """Where slots live: Redis in a cluster (`RedisToolStateStore`),
    the process's memory without one (`LocalToolStateStore`)."""

    def hold(
        self, tenant: str, program_id: str, lease_s: float
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Exclusive use of the program's slots, waiting at most `lease_s` for it
        (`ToolStateUnavailable` then); a holder that dies lets go when its lease
        of `lease_s` ends."""
        ...

    async def load(self, tenant: str, program_id: str, slot: str) -> SlotContents: ...

    async def save(self, tenant: str, program_id: str, slot: str, value: str) -> None: ...

    async def set_scenario(self, tenant: str, program_id: str, slot: str, scenario: Any) -> None:
        """Starts the slot over from `scenario` (what earlier calls left is dropped)."""
        ...

    async def clear(self, tenant: str, program_id: str) -> None:
        """Drops every slot of the program."""
        ...


class LocalToolStateStore:
    """Slots in this process's memory, each program's forgotten `ttl_s` after its last write."""

    def __init__(self, ttl_s: float):
        self._ttl_s = ttl_s
        self._slots: dict[tuple[str, str], tuple[float, dict[str, SlotContents]]] = {}
        # A program's lock and how many calls hold or await it (dropped at none).
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, tenant: str, program_id: str, lease_s: float) -> AsyncIterator[None]:
        key = (tenant, program_id)
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            try:
                async with asyncio.timeout(lease_s):
                    await lock.acquire()
            except TimeoutError:
                busy = f"program {program_id!r} is busy with another call"
                raise ToolStateUnavailable(busy) from None
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key in [key for key, (expires, _) in self._slots.items() if expires <= now]:
            del self._slots[key]

    def _written(self, tenant: str, program_id: str) -> dict[str, SlotContents]:
        self._forget_expired()
        _, slots = self._slots.get((tenant, program_id), (0.0, {}))
        self._slots[(tenant, program_id)] = (time.monotonic() + self._ttl_s, slots)
        return slots

    async def load(self, tenant: str, program_id: str, slot: str) -> SlotContents:
        self._forget_expired()
        _, slots = self._slots.get((tenant, program_id), (0.0, {}))
        return slots.get(slot, SlotContents(None, None))

    async def save(self, tenant: str, program_id: str, slot: str, value: str) -> None:
        slots = self._written(tenant, program_id)
        slots[slot] = SlotContents(value, slots.get(slot, SlotContents(None, None)).scenario)

    async def set_scenario(self, tenant: str, program_id: str, slot: str, scenario: Any) -> None:
        self._written(tenant, program_id)[slot] = SlotContents(None, scenario)

    async def clear(self, tenant: str, program_id: str) -> None:
        self._slots.pop((tenant, program_id), None)


_TOOL_STATE_PREFIX = "toolserve:tool-state:"
_TOOL_STATE_LOCK_PREFIX = "toolserve:tool-state-lock:"
_RELEASE_IF_HOLDER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisToolStateStore:
    """Slots in Redis: one hash per tenant and
    program (`value:<slot>`, `scenario:<slot>`), kept `ttl_s` after its last write,
    and a lock with a lease per program. Redis being down fails the call that needs
    the state (`ToolStateUnavailable`) rather than run it on a state it cannot keep."""

    def __init__(self, url: str, ttl_s: float):
        self._client = async_client(url, socket_timeout_s=_STATE_SOCKET_TIMEOUT_S)
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
        except UNREACHABLE as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error
        try:
            yield
        finally:
            try:
                await self._release(keys=[lock_key], args=[token])
            except UNREACHABLE as error:
                logger.warning("tool state: lock of %s left to expire: %s", program_id, error)

    async def load(self, tenant: str, program_id: str, slot: str) -> SlotContents:
        try:
            value, scenario = await self._client.hmget(
                self._key(tenant, program_id), [f"value:{slot}", f"scenario:{slot}"]
            )
        except UNREACHABLE as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error
        return SlotContents(
            None if value is None else text(value),
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
        except UNREACHABLE as error:
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
        except UNREACHABLE as error:
            raise ToolStateUnavailable(f"Redis: {type(error).__name__}: {error}") from error

    async def close(self) -> None:
        await self._client.aclose()

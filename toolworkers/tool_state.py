"""Per-program state of stateful hosted tools (BFCL's file system, trading bot, ...).

A tool declares a state slot (`@hosted_tool(state_slot=...)`); all tools of a slot
share one state per program (and tenant). A call sees the state the program's
previous call on the slot left, or, before any call, the slot's scenario: the
initial state the client set (`PUT /v1/sessions/{program}/tool-state/{slot}`).
The executor runs one call of a program at a time and stores the state a call
leaves only when the call succeeded, so a failed call changes nothing.

The state crosses the sandbox boundary pickled (base64 text inside the JSON
request and reply); only the executor's own store ever supplies it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pickle
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ToolState:
    """A program's state slot as a stateful tool sees it: `value` is what the
    previous call left (None before the first), `scenario` the initial state the
    client set for the slot (None if none). Assign `value` to keep a new state."""

    value: Any
    scenario: Any


@dataclass(frozen=True)
class SlotContents:
    """A slot as stored: `value` encoded by `encode_value` (None before any call)
    and the scenario (JSON, None if the client set none)."""

    value: str | None
    scenario: Any


def encode_value(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def decode_value(text: str | None) -> Any:
    return None if text is None else pickle.loads(base64.b64decode(text))


class ToolStateUnavailable(Exception):
    """The state could not be read, locked or stored (the store is down or busy)."""


class ToolStateStore(Protocol):
    """Where slots live: Redis in a cluster (`cluster.store.RedisToolStateStore`),
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

"""Pinned KV across the cluster: the TTL ledger (which replica holds a program's
pinned KV, and until when) and the control channel to the replicas' pinning.

The engine writes the ledger from a thread (`TtlLedger`, synchronous); the router
and ingress read it and send control messages from asyncio (`PinStore`). Both use
the same keys and scripts."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from cluster.store._redis import (
    UNREACHABLE,
    async_client,
    or_fallback,
    sync_client,
    sync_or_fallback,
)

logger = logging.getLogger("toolserve.store")


@dataclass(frozen=True)
class LedgerEntry:
    """A program's KV pinned on a replica until `expires_at` (Unix seconds)."""

    program_id: str
    replica_id: str
    expires_at: float
    tokens: int
    tool: str | None


class ControlOperation(StrEnum):
    END_PROGRAM = "end_program"
    """The client closed the session: drop the program's pins everywhere."""
    RELEASE_PIN = "release_pin"
    """The router moved the program: its old replica lets its pin go."""


@dataclass(frozen=True)
class PinningControl:
    """A message to main-model replicas; `replica_id` None addresses every replica."""

    operation: ControlOperation
    program_id: str
    replica_id: str | None = None


_LEDGER_PREFIX = "toolserve:ttl-ledger"
_PROGRAM_KEY_PREFIX = f"{_LEDGER_PREFIX}:program:"
CONTROL_CHANNEL = "toolserve:pinning-control"

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


def _program_key(program_id: str) -> str:
    return _PROGRAM_KEY_PREFIX + program_id


def _replica_key(replica_id: str) -> str:
    return f"{_LEDGER_PREFIX}:replica:{replica_id}"


class _ScriptCall(NamedTuple):
    keys: list[str]
    args: list[str]


def _remove_call(program_id: str, replica_id: str) -> _ScriptCall:
    return _ScriptCall(
        [_program_key(program_id), _replica_key(replica_id)], [replica_id, program_id]
    )


def _clear_call(replica_id: str) -> _ScriptCall:
    return _ScriptCall([_replica_key(replica_id)], [_PROGRAM_KEY_PREFIX, replica_id])


def _entry(raw: bytes | str | None) -> LedgerEntry | None:
    return None if raw is None else LedgerEntry(**json.loads(raw))


class TtlLedger:
    """The engine's writer of the ledger. Entries expire in Redis at the pin's
    expiry, so a crashed replica's entries vanish on their own."""

    def __init__(self, url: str):
        self._client = sync_client(url)
        self._remove_if_owner = self._client.register_script(_REMOVE_IF_OWNER)
        self._clear_replica = self._client.register_script(_CLEAR_REPLICA)

    def put(self, entry: LedgerEntry) -> bool:
        def write() -> bool:
            pipeline = self._client.pipeline(transaction=True)
            pipeline.set(
                _program_key(entry.program_id),
                json.dumps(asdict(entry)),
                pxat=int(entry.expires_at * 1000),
            )
            pipeline.sadd(_replica_key(entry.replica_id), entry.program_id)
            pipeline.execute()
            return True

        return sync_or_fallback(
            write, False, f"ttl ledger: cannot publish pin of {entry.program_id}"
        )

    def remove(self, program_id: str, replica_id: str) -> bool:
        def remove() -> bool:
            self._remove_if_owner(*_remove_call(program_id, replica_id))
            return True

        return sync_or_fallback(remove, False, f"ttl ledger: cannot withdraw pin of {program_id}")

    def lookup(self, program_id: str) -> LedgerEntry | None:
        return sync_or_fallback(
            lambda: _entry(self._client.get(_program_key(program_id))),
            None,
            f"ttl ledger: cannot look up {program_id}",
        )

    def pins_by_replica(self) -> dict[str, int] | None:
        """How many live pins each replica holds; None when Redis cannot answer."""

        def count() -> dict[str, int]:
            keys = list(self._client.scan_iter(f"{_PROGRAM_KEY_PREFIX}*", count=1000))
            entries = [_entry(raw) for raw in self._client.mget(keys)] if keys else []
            return dict(Counter(entry.replica_id for entry in entries if entry is not None))

        return sync_or_fallback(count, None, "ttl ledger: cannot count pins")

    def clear_replica(self, replica_id: str) -> int:
        """Drop every entry a replica owns (on its start and shutdown)."""
        return sync_or_fallback(
            lambda: int(self._clear_replica(*_clear_call(replica_id))),
            0,
            f"ttl ledger: cannot clear replica {replica_id}",
        )

    def close(self) -> None:
        self._client.close()


class PinStore:
    """The ledger's readers (router, ingress) and the control channel, for asyncio
    code. A store belongs to the event loop that first uses it."""

    def __init__(self, url: str):
        self._client = async_client(url)
        self._remove_if_owner = self._client.register_script(_REMOVE_IF_OWNER)
        self._clear_replica = self._client.register_script(_CLEAR_REPLICA)

    async def lookup(self, program_id: str) -> LedgerEntry | None:
        """The program's entry; raises when Redis cannot answer (`_redis.UNREACHABLE`),
        so a caller can tell "no pin" from "unknown"."""
        return _entry(await self._client.get(_program_key(program_id)))

    async def drop(self, program_id: str, replica_id: str) -> None:
        await or_fallback(
            self._remove_if_owner(*_remove_call(program_id, replica_id)),
            None,
            f"ttl ledger: cannot drop pin of {program_id}",
        )

    async def clear_replica(self, replica_id: str) -> int:
        owned = await or_fallback(
            self._clear_replica(*_clear_call(replica_id)),
            0,
            f"ttl ledger: cannot clear replica {replica_id}",
        )
        return int(owned)

    async def send_control(self, message: PinningControl) -> int:
        """Publishes to the replicas; returns how many replicas listened (0 when
        Redis is unreachable, so the caller can fall back)."""
        listeners = await or_fallback(
            self._client.publish(CONTROL_CHANNEL, json.dumps(asdict(message))),
            0,
            f"cannot publish {message}",
        )
        return int(listeners)

    async def control_messages(self, retry_s: float = 2.0) -> AsyncIterator[PinningControl]:
        """Every message on the control channel, resubscribing after Redis outages
        (messages sent meanwhile are lost; pins expire by their TTL)."""
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(CONTROL_CHANNEL)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        control = _parse_control(message["data"])
                        if control is not None:
                            yield control
            except UNREACHABLE as error:
                logger.warning("pinning control channel lost: %s; resubscribing", error)
                await asyncio.sleep(retry_s)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._client.aclose()


def _parse_control(data: Any) -> PinningControl | None:
    try:
        fields = json.loads(data)
        return PinningControl(
            ControlOperation(fields["operation"]), fields["program_id"], fields.get("replica_id")
        )
    except (TypeError, ValueError, KeyError) as error:
        logger.warning("ignoring malformed pinning control: %s", error)
        return None

"""The TTL ledger against a real Redis."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import redis
from redis.exceptions import RedisError

from cluster.store.pins import (
    CONTROL_CHANNEL,
    ControlOperation,
    LedgerEntry,
    PinningControl,
    PinStore,
    TtlLedger,
)


def entry(program_id: str, replica_id: str, ttl_s: float = 30.0) -> LedgerEntry:
    return LedgerEntry(program_id, replica_id, time.time() + ttl_s, tokens=512, tool="ls")


def test_put_lookup_remove(redis_url: str) -> None:
    ledger = TtlLedger(redis_url)
    program = f"program-{uuid.uuid4().hex}"
    pinned = entry(program, "replica-a")
    assert ledger.put(pinned)
    assert ledger.lookup(program) == pinned
    assert ledger.remove(program, "replica-a")
    assert ledger.lookup(program) is None
    ledger.close()


def test_only_the_owner_removes_an_entry(redis_url: str) -> None:
    ledger = TtlLedger(redis_url)
    program = f"program-{uuid.uuid4().hex}"
    ledger.put(entry(program, "replica-a"))
    ledger.put(entry(program, "replica-b"))
    ledger.remove(program, "replica-a")
    found = ledger.lookup(program)
    assert found is not None and found.replica_id == "replica-b"
    ledger.clear_replica("replica-b")
    ledger.close()


def test_entries_expire_with_their_pin(redis_url: str) -> None:
    ledger = TtlLedger(redis_url)
    program = f"program-{uuid.uuid4().hex}"
    ledger.put(entry(program, "replica-a", ttl_s=0.2))
    assert ledger.lookup(program) is not None
    time.sleep(0.4)
    assert ledger.lookup(program) is None
    ledger.close()


def test_clearing_a_restarted_replica_drops_its_stale_entries(redis_url: str) -> None:
    ledger = TtlLedger(redis_url)
    replica = f"replica-{uuid.uuid4().hex}"
    programs = [f"program-{uuid.uuid4().hex}" for _ in range(3)]
    for program in programs:
        ledger.put(entry(program, replica))
    assert ledger.clear_replica(replica) == 3
    assert all(ledger.lookup(program) is None for program in programs)
    assert redis.Redis.from_url(redis_url).exists(f"toolserve:ttl-ledger:replica:{replica}") == 0
    ledger.close()


def test_pins_are_counted_by_the_replica_that_holds_them_while_they_live(
    redis_url: str,
) -> None:
    ledger = TtlLedger(redis_url)
    first, second = (f"replica-{uuid.uuid4().hex}" for _ in range(2))
    for _ in range(3):
        ledger.put(entry(f"program-{uuid.uuid4().hex}", first))
    moved = f"program-{uuid.uuid4().hex}"
    ledger.put(entry(moved, first))
    ledger.put(entry(moved, second))
    ledger.put(entry(f"program-{uuid.uuid4().hex}", second, ttl_s=0.2))
    counted = ledger.pins_by_replica()
    assert counted is not None
    assert (counted.get(first), counted.get(second)) == (3, 2)
    time.sleep(0.4)
    counted = ledger.pins_by_replica()
    assert counted is not None
    assert (counted.get(first), counted.get(second)) == (3, 1)
    ledger.close()


def test_an_unreachable_redis_gives_no_answer_instead_of_an_error() -> None:
    ledger = TtlLedger("redis://127.0.0.1:1/0")
    assert not ledger.put(entry("p", "r"))
    assert ledger.lookup("p") is None
    assert not ledger.remove("p", "r")
    assert ledger.clear_replica("r") == 0
    assert ledger.pins_by_replica() is None
    ledger.close()


def test_the_async_store_reads_drops_and_clears_what_engines_publish(redis_url: str) -> None:
    ledger = TtlLedger(redis_url)
    replica = f"replica-{uuid.uuid4().hex}"
    kept, dropped = f"program-{uuid.uuid4().hex}", f"program-{uuid.uuid4().hex}"
    ledger.put(entry(kept, replica))
    ledger.put(entry(dropped, replica))

    async def scenario() -> None:
        store = PinStore(redis_url)
        assert await store.lookup(kept) == ledger.lookup(kept)
        await store.drop(dropped, "another-replica")  # not the owner: stays
        assert await store.lookup(dropped) is not None
        await store.drop(dropped, replica)
        assert await store.lookup(dropped) is None
        assert await store.clear_replica(replica) == 1
        assert await store.lookup(kept) is None
        await store.close()

    asyncio.run(scenario())
    ledger.close()


def test_pinning_control_reaches_every_subscriber_and_skips_unknown_operations(
    redis_url: str,
) -> None:
    program = f"program-{uuid.uuid4().hex}"
    sent = [
        PinningControl(ControlOperation.RELEASE_PIN, program, "replica-a"),
        PinningControl(ControlOperation.END_PROGRAM, program),
    ]

    async def scenario() -> list[PinningControl]:
        listener, sender = PinStore(redis_url), PinStore(redis_url)
        received: list[PinningControl] = []

        async def listen() -> None:
            async for message in listener.control_messages():
                if message.program_id == program:
                    received.append(message)
                    if message == sent[-1]:
                        return

        listening = asyncio.create_task(listen())
        # Until the listener is subscribed (a cluster on the same Redis may be too).
        while not received:
            await sender.send_control(sent[0])
            await asyncio.sleep(0.05)
        unknown = {"operation": "drop_everything", "program_id": program}
        redis.Redis.from_url(redis_url).publish(CONTROL_CHANNEL, json.dumps(unknown))
        await sender.send_control(sent[1])
        await asyncio.wait_for(listening, timeout=10)
        await listener.close()
        await sender.close()
        return received

    received = asyncio.run(scenario())
    assert received[-2:] == sent


def test_the_async_store_without_redis() -> None:
    async def scenario() -> None:
        store = PinStore("redis://127.0.0.1:1/0")
        with pytest.raises((RedisError, OSError)):
            await store.lookup("p")
        await store.drop("p", "r")
        assert await store.clear_replica("r") == 0
        assert await store.send_control(PinningControl(ControlOperation.END_PROGRAM, "p")) == 0
        await store.close()

    asyncio.run(scenario())

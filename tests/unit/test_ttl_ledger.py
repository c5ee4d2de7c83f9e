"""The TTL ledger against a real Redis."""

from __future__ import annotations

import time
import uuid

import redis

from cluster.store import LedgerEntry, TtlLedger


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


def test_an_unreachable_redis_gives_no_answer_instead_of_an_error() -> None:
    ledger = TtlLedger("redis://127.0.0.1:1/0")
    assert not ledger.put(entry("p", "r"))
    assert ledger.lookup("p") is None
    assert not ledger.remove("p", "r")
    assert ledger.clear_replica("r") == 0
    ledger.close()

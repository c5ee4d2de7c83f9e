"""Publishes an engine's pins to the TTL ledger from a background thread, so the
engine step never waits on Redis. A change that cannot reach Redis is dropped:
ledger entries are hints that expire with their pins anyway."""

from __future__ import annotations

import logging
import queue
import threading

from cluster.policies.pinning_controller import LedgerChange
from cluster.store.pins import LedgerEntry, TtlLedger

logger = logging.getLogger("toolserve.pinning.ledger")

_MAX_BACKLOG = 100_000


class LedgerPublisher:
    def __init__(self, redis_url: str, replica_id: str):
        self._replica_id = replica_id
        self._changes: queue.SimpleQueue[list[LedgerChange] | None] = queue.SimpleQueue()
        self._ledger = TtlLedger(redis_url)
        self._thread = threading.Thread(target=self._run, name="toolserve-ttl-ledger", daemon=True)
        self._thread.start()

    def publish(self, changes: list[LedgerChange]) -> None:
        if changes and self._changes.qsize() < _MAX_BACKLOG:
            self._changes.put(changes)

    def close(self) -> None:
        self._changes.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        self._ledger.clear_replica(self._replica_id)
        while (changes := self._changes.get()) is not None:
            for change in changes:
                if change.expires_at is None:
                    self._ledger.remove(change.program_id, self._replica_id)
                else:
                    self._ledger.put(
                        LedgerEntry(
                            program_id=change.program_id,
                            replica_id=self._replica_id,
                            expires_at=change.expires_at,
                            tokens=change.tokens,
                            tool=change.tool,
                        )
                    )
        self._ledger.clear_replica(self._replica_id)
        self._ledger.close()

"""Replica status reports in the real Redis: announced, read back per deployment,
and forgotten when a replica is gone."""

from __future__ import annotations

import asyncio
import uuid

from cluster.store.replicas import EngineState, ReplicaStatus, ReplicaStatusStore


def test_a_forgotten_replica_is_no_longer_reported(redis_url: str) -> None:
    deployment = f"test-{uuid.uuid4().hex[:8]}"
    ready = ReplicaStatus("a", "main", "m", EngineState.READY, "engine is ready", "10.0.0.3")
    loading = ReplicaStatus("b", "main", "m", EngineState.STARTING, "engine is loading")

    async def scenario() -> tuple[list[ReplicaStatus] | None, list[ReplicaStatus] | None]:
        store = ReplicaStatusStore(redis_url)
        try:
            for status in (ready, loading):
                assert await store.announce(deployment, status, ttl_s=30)
            before = await store.statuses(deployment)
            await store.forget(deployment, "a")
            return before, await store.statuses(deployment)
        finally:
            await store.close()

    before, after = asyncio.run(scenario())
    assert sorted(before or [], key=lambda s: s.replica_id) == [ready, loading]
    assert after == [loading]


def test_a_report_redis_does_not_take_says_so() -> None:
    status = ReplicaStatus("a", "main", "m", EngineState.READY, "engine is ready")

    async def scenario() -> bool:
        store = ReplicaStatusStore("redis://127.0.0.1:1/0")
        try:
            return await store.announce("test", status, ttl_s=30)
        finally:
            await store.close()

    assert asyncio.run(scenario()) is False

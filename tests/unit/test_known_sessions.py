"""Known sessions and their parents against a real Redis."""

from __future__ import annotations

import asyncio
import uuid

import redis

from cluster.store.sessions import KnownSessions


def test_a_fork_remembers_its_parent_across_turns_until_it_ends(redis_url: str) -> None:
    parent, child = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("parent", "child"))

    async def scenario() -> list[object]:
        sessions = KnownSessions(redis_url)
        seen: list[object] = [
            await sessions.touch(parent, 60),
            await sessions.touch(child, 60, parent_id=parent),
            await sessions.touch(child, 60),  # a later turn names no parent
            await sessions.forget(child),
            await sessions.touch(child, 60),
        ]
        await sessions.forget(parent)
        await sessions.forget(child)
        await sessions.close()
        return seen

    assert asyncio.run(scenario()) == [None, parent, parent, True, None]


def test_a_session_recorded_by_an_older_version_has_no_parent(redis_url: str) -> None:
    program = f"older-{uuid.uuid4().hex[:8]}"
    redis.Redis.from_url(redis_url).set("toolserve:session:" + program, 1, px=60_000)

    async def scenario() -> str | None:
        sessions = KnownSessions(redis_url)
        parent = await sessions.touch(program, 60)
        await sessions.forget(program)
        await sessions.close()
        return parent

    assert asyncio.run(scenario()) is None


def test_without_redis_a_turn_goes_unrecorded() -> None:
    async def scenario() -> str | None:
        sessions = KnownSessions("redis://127.0.0.1:1/0")
        parent = await sessions.touch("p", 60, parent_id="q")
        await sessions.close()
        return parent

    assert asyncio.run(scenario()) is None

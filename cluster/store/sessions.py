"""The sessions the cluster knows: a program id (as the cluster keys it) is known
from its opening, first turn or tool-state reset until it is ended or idle too
long, so ending an unknown session can answer 404; a forked session's record
names its parent. Beside it, what the session's prompts did with the prefix the
engine held for them (`record_prefix`), expiring with the session."""

from __future__ import annotations

import json
import logging
from typing import Any

from cluster.store._redis import UNREACHABLE, async_client, or_fallback, text

logger = logging.getLogger("toolserve.store.sessions")

_PREFIX = "toolserve:session:"
_PREFIX_CHECKS = "toolserve:session-prefix:"
_PARENT = "parent:"
_COUNTS = ("checked_turns", "breaks", "repaired", "tokens_recomputed")


def _parent(stored: str) -> str | None:
    if not stored.startswith(_PARENT):  # recorded by an older version
        return None
    return stored.removeprefix(_PARENT) or None


class KnownSessions:
    """One expiring key per session. A store belongs to the event loop that
    first uses it."""

    def __init__(self, url: str):
        self._client = async_client(url)

    async def touch(
        self, program_id: str, idle_ttl_s: float, parent_id: str | None = None
    ) -> str | None:
        """The session had a turn (or a reset) now; returns the program it was
        forked from, if any (`parent_id` records that it was). When Redis cannot
        answer, the session goes unrecorded and a later end is served without
        the check."""
        key = _PREFIX + program_id
        ttl_ms = max(1, int(idle_ttl_s * 1000))
        pipeline = self._client.pipeline(transaction=False)
        # The value names the parent, if any; a turn without a parent keeps it.
        pipeline.set(key, _PARENT + (parent_id or ""), px=ttl_ms, nx=parent_id is None)
        pipeline.pexpire(key, ttl_ms)
        pipeline.get(key)
        replies = await or_fallback(pipeline.execute(), None, f"cannot record session {program_id}")
        return _parent(text(replies[-1])) if replies and replies[-1] is not None else None

    async def lookup(self, program_id: str) -> tuple[bool, str | None] | None:
        """Whether the session is known, and its parent; None when Redis cannot
        answer."""
        try:
            stored = await self._client.get(_PREFIX + program_id)
        except UNREACHABLE as error:
            logger.warning("cannot look up session %s: %s", program_id, error)
            return None
        return (False, None) if stored is None else (True, _parent(text(stored)))

    async def forget(self, program_id: str) -> bool | None:
        """Whether the session was known (and is no longer); None when Redis
        cannot answer."""
        pipeline = self._client.pipeline(transaction=False)
        pipeline.delete(_PREFIX + program_id)
        pipeline.delete(_PREFIX_CHECKS + program_id)
        removed = await or_fallback(pipeline.execute(), None, f"cannot end session {program_id}")
        return None if removed is None else removed[0] > 0

    async def record_prefix(
        self, program_id: str, check: dict[str, Any], idle_ttl_s: float
    ) -> None:
        """A turn's prompt checked against the prefix the engine held for the
        session (`PrefixCheck.as_json`): kept as the session's last check, and
        counted."""
        key = _PREFIX_CHECKS + program_id
        pipeline = self._client.pipeline(transaction=False)
        pipeline.hset(key, "last", json.dumps(check))
        pipeline.hincrby(key, "checked_turns", 1)
        if check.get("first_divergent_position") is not None:
            pipeline.hincrby(key, "breaks", 1)
            pipeline.hincrby(key, "repaired", int(bool(check.get("repaired"))))
        pipeline.hincrby(key, "tokens_recomputed", int(check.get("tokens_recomputed") or 0))
        pipeline.pexpire(key, max(1, int(idle_ttl_s * 1000)))
        await or_fallback(pipeline.execute(), None, f"cannot record prefix of {program_id}")

    async def prefix(self, program_id: str) -> dict[str, Any] | None:
        """The session's prefix record: its counts and last check; None when none
        was recorded (or Redis cannot answer)."""
        stored = await or_fallback(
            self._client.hgetall(_PREFIX_CHECKS + program_id),
            None,
            f"cannot read prefix of {program_id}",
        )
        if not stored:
            return None
        fields = {text(name): text(value) for name, value in stored.items()}
        record: dict[str, Any] = {name: int(fields.get(name, 0)) for name in _COUNTS}
        record["last"] = json.loads(fields["last"]) if "last" in fields else None
        return record

    async def close(self) -> None:
        await self._client.aclose()

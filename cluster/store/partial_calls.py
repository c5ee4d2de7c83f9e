"""The pieces of a partially executed tool call, from the model replica that reads
them off the engine's stream to the tool worker that runs them: one Redis list
per call, pushed in order and popped in order, gone a while after its last push.

Messages are JSON objects: `{"piece": ...}` for each piece, then `{"finish":
arguments}` or `{"abandon": reason}`."""

from __future__ import annotations

import json
from typing import Any

from cluster.store._redis import UNREACHABLE, async_client, text

_PREFIX = "toolserve:partial:"
# A call whose reader is gone (its worker died) leaves its list this long at most.
_LIST_TTL_S = 600


class ChannelUnavailable(Exception):
    """Redis could not carry a message."""


class PartialCallChannel:
    """Both ends of every partial call's list. A channel belongs to the event loop
    that first uses it. `receive` waits up to `longest_wait_s`."""

    def __init__(self, url: str, longest_wait_s: float = 1.0):
        # A blocking pop holds the connection for its whole wait.
        self._client = async_client(url, socket_timeout_s=longest_wait_s + 1.0)

    async def send(self, call_id: str, message: dict[str, Any]) -> None:
        key = _PREFIX + call_id
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.rpush(key, json.dumps(message, default=str))
                pipe.expire(key, _LIST_TTL_S)
                await pipe.execute()
        except UNREACHABLE as error:
            raise ChannelUnavailable(str(error)) from error

    async def receive(self, call_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The call's next message, waiting up to `timeout_s` for it; None if none came."""
        try:
            popped = await self._client.blpop([_PREFIX + call_id], timeout=timeout_s)
        except UNREACHABLE as error:
            raise ChannelUnavailable(str(error)) from error
        if popped is None:
            return None
        _key, raw = popped
        message: dict[str, Any] = json.loads(text(raw))
        return message

    async def close(self) -> None:
        await self._client.aclose()

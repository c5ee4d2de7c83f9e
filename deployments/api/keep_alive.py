"""SSE keep-alive: a comment line sent while a stream has nothing to say, so a
turn that waits for its place in the engine (minutes, under program FCFS,
when many programs arrive at once) is not taken for a dead connection by the
client's read timeout or a proxy's idle timeout. SSE clients skip comment
lines (the `openai` SDK among them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

KEEP_ALIVE_COMMENT = ": keep-alive\n\n"


async def with_keep_alive(chunks: AsyncIterator[str], interval_s: float) -> AsyncIterator[str]:
    """`chunks`, with `KEEP_ALIVE_COMMENT` after every `interval_s` without a chunk.
    Closing this stream (a client gone) cancels the chunk awaited and closes
    `chunks`."""
    waiting: asyncio.Future[str] | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.ensure_future(anext(chunks))
            done, _ = await asyncio.wait({waiting}, timeout=interval_s)
            if not done:
                yield KEEP_ALIVE_COMMENT
                continue
            try:
                chunk = waiting.result()
            except StopAsyncIteration:
                return
            waiting = None
            yield chunk
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()
            # `chunks` cannot be closed while the awaited chunk's task still runs it.
            await asyncio.wait({waiting})
            if not waiting.cancelled():
                waiting.exception()  # retrieved: the client is gone, nobody reads it
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()

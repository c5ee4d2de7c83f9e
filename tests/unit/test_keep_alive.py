import asyncio
from collections.abc import AsyncIterator

import pytest

from deployments.api.keep_alive import KEEP_ALIVE_COMMENT, with_keep_alive


class HeldSource:
    """SSE chunks, each released by the test; records how the stream ended."""

    def __init__(self) -> None:
        self.release = asyncio.Queue[str | None]()
        self.closed = False
        self.cancelled = False

    async def chunks(self) -> AsyncIterator[str]:
        try:
            while (chunk := await self.release.get()) is not None:
                yield chunk
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


def test_a_held_stream_gets_comments_until_its_chunk_and_then_the_chunks_unchanged():
    async def scenario() -> list[str]:
        source = HeldSource()
        stream = with_keep_alive(source.chunks(), interval_s=0.01)
        received = [await anext(stream), await anext(stream)]
        await source.release.put("data: {}\n\n")
        while (chunk := await anext(stream)) == KEEP_ALIVE_COMMENT:
            pass
        received.append(chunk)
        await source.release.put("data: [DONE]\n\n")
        await source.release.put(None)
        received += [chunk async for chunk in stream if chunk != KEEP_ALIVE_COMMENT]
        return received

    assert asyncio.run(scenario()) == [
        KEEP_ALIVE_COMMENT,
        KEEP_ALIVE_COMMENT,
        "data: {}\n\n",
        "data: [DONE]\n\n",
    ]


def test_a_stream_that_keeps_talking_gets_no_comment():
    async def chunks() -> AsyncIterator[str]:
        for index in range(50):
            yield f"data: {index}\n\n"

    async def scenario() -> list[str]:
        return [chunk async for chunk in with_keep_alive(chunks(), interval_s=60)]

    assert asyncio.run(scenario()) == [f"data: {index}\n\n" for index in range(50)]


def test_closing_the_stream_while_a_chunk_is_awaited_cancels_and_closes_the_source():
    async def scenario() -> HeldSource:
        source = HeldSource()
        stream = with_keep_alive(source.chunks(), interval_s=0.01)
        assert await anext(stream) == KEEP_ALIVE_COMMENT
        await stream.aclose()  # type: ignore[attr-defined]
        return source

    source = asyncio.run(scenario())
    assert source.cancelled and source.closed


def test_a_client_gone_mid_wait_cancels_the_source():
    async def scenario() -> HeldSource:
        source = HeldSource()

        async def reader() -> None:
            async for _ in with_keep_alive(source.chunks(), interval_s=0.01):
                pass

        reading = asyncio.ensure_future(reader())
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        return source

    source = asyncio.run(scenario())
    assert source.cancelled and source.closed


def test_a_failing_source_fails_the_stream():
    async def chunks() -> AsyncIterator[str]:
        yield "data: {}\n\n"
        raise RuntimeError("replica lost")

    async def scenario() -> list[str]:
        received = []
        async for chunk in with_keep_alive(chunks(), interval_s=60):
            received.append(chunk)
        return received

    with pytest.raises(RuntimeError, match="replica lost"):
        asyncio.run(scenario())

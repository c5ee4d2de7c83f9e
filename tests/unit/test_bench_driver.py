"""The benchmark client's reading of streamed replies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from openai.types.chat import ChatCompletionChunk

from bench.driver import reply_from_stream
from bench.workloads.program import ToolCall


def _chunk(delta: dict[str, Any] | None, **extra: Any) -> ChatCompletionChunk:
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": extra.pop("finish", None)}]
    )
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": choices,
        }
        | extra
    )


async def _stream(chunks: list[ChatCompletionChunk]) -> AsyncIterator[ChatCompletionChunk]:
    for chunk in chunks:
        yield chunk


def test_a_streamed_reply_adds_up_its_content_calls_executed_messages_and_usage() -> None:
    executed = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "s1"}]},
        {"role": "tool", "tool_call_id": "s1", "content": "42"},
    ]
    chunks = [
        _chunk({"role": "assistant", "content": "Let "}),
        _chunk({"content": "me."}),
        _chunk({}, toolserve={"executed_messages": executed}),
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        _chunk({}, finish="tool_calls"),
        _chunk(
            None,
            usage={
                "prompt_tokens": 30,
                "completion_tokens": 12,
                "total_tokens": 42,
                "prompt_tokens_details": {"cached_tokens": 16},
            },
        ),
    ]
    reply = asyncio.run(reply_from_stream(_stream(chunks), "replica-1"))
    assert reply.content == "Let me."
    assert reply.tool_calls == (ToolCall("c1", "f", '{"a": 1}'),)
    assert reply.finish_reason == "tool_calls"
    assert (reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens) == (30, 16, 12)
    assert reply.executed_messages == tuple(executed)
    assert reply.replica == "replica-1"


def test_a_streamed_reply_times_its_first_server_run_tool_result() -> None:
    executed = [{"role": "tool", "tool_call_id": "s1", "content": "error: invalid call"}]

    async def slow_stream() -> AsyncIterator[ChatCompletionChunk]:
        yield _chunk({"content": "I will."})
        await asyncio.sleep(0.05)
        yield _chunk({}, toolserve={"executed_messages": executed})
        await asyncio.sleep(0.05)
        yield _chunk({"content": " Done."}, finish="stop")

    sent = time.monotonic()
    reply = asyncio.run(reply_from_stream(slow_stream(), sent=sent))
    assert reply.first_result_s is not None
    assert 0.04 <= reply.first_result_s <= time.monotonic() - sent - 0.04
    plain = asyncio.run(reply_from_stream(_stream([_chunk({"content": "Hi"})]), sent=sent))
    assert plain.first_result_s is None

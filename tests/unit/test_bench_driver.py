"""The benchmark client's reading of streamed replies: content, calls, usage,
the first token's and the first server-run tool result's times."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from openai.types.chat import ChatCompletionChunk

from bench.driver import REPLICA_HEADER, Driver, reply_from_stream
from bench.records import RequestRecord
from bench.workloads.distributions import Distribution
from bench.workloads.program import ToolCall
from bench.workloads.replay import CODING_PROFILE, ReplayConfig, generate_replay, vocabulary_text


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


def test_a_streamed_reply_times_its_first_generated_token() -> None:
    async def slow_stream() -> AsyncIterator[ChatCompletionChunk]:
        yield _chunk({"role": "assistant"})
        await asyncio.sleep(0.05)
        yield _chunk({"content": "First"})
        await asyncio.sleep(0.05)
        yield _chunk({"content": " words."}, finish="length")

    sent = time.monotonic()
    reply = asyncio.run(reply_from_stream(slow_stream(), sent=sent))
    assert reply.first_token_s is not None
    assert 0.04 <= reply.first_token_s <= time.monotonic() - sent - 0.04
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}
    called = asyncio.run(reply_from_stream(_stream([_chunk({"tool_calls": [call]})]), sent=sent))
    assert called.first_token_s is not None, "a call's first delta is a generated token"
    silent = asyncio.run(reply_from_stream(_stream([_chunk({}, finish="length")]), sent=sent))
    assert silent.first_token_s is None
    untimed = asyncio.run(reply_from_stream(_stream([_chunk({"content": "Hi"})])))
    assert untimed.first_token_s is None


class _RawStream:
    """What `with_raw_response.create(stream=True)` returns, as the driver reads it."""

    def __init__(self, chunks: list[ChatCompletionChunk]):
        self.headers = {REPLICA_HEADER: "replica-0"}
        self._chunks = chunks

    def parse(self) -> AsyncIterator[ChatCompletionChunk]:
        return _stream(self._chunks)


class _StreamingServer:
    """Stands in for the SDK client: answers each turn with the exact number of
    tokens asked, streamed, usage in the last chunk, and keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self
        self.with_raw_response = self

    async def create(self, **arguments: Any) -> _RawStream:
        self.sent.append(arguments)
        tokens = arguments["max_tokens"]
        usage = {
            "prompt_tokens": 100 * len(self.sent),
            "completion_tokens": tokens,
            "total_tokens": 100 * len(self.sent) + tokens,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
        return _RawStream(
            [
                _chunk({"role": "assistant", "content": ""}),
                *(_chunk({"content": " x"}) for _ in range(tokens)),
                _chunk({}, finish="length"),
                _chunk(None, usage=usage),
            ]
        )


def test_replayed_turns_are_streamed_and_recorded_with_tokens_and_first_token() -> None:
    no_pause = Distribution(kind="constant", mean=0.0)
    profile = CODING_PROFILE.model_copy(
        update={"tool_pause_s": no_pause, "turns": Distribution(kind="constant", mean=2)}
    )
    config = ReplayConfig(programs=1, arrival_rate_per_s=0, max_context=10**6, profiles=(profile,))
    (program,) = generate_replay(config, 0, vocabulary_text([f"w{i}" for i in range(20)]))
    driver = Driver("http://127.0.0.1:1/v1", "m", "stock-vllm", 0)
    server = _StreamingServer()
    driver._client = server  # type: ignore[assignment]
    requests: list[RequestRecord] = []
    record = asyncio.run(driver.run_program(program, time.monotonic(), requests))
    assert record.error is None and record.turns == 2
    for arguments, shape in zip(server.sent, program.shapes, strict=True):
        assert arguments["stream"] is True
        assert arguments["stream_options"] == {"include_usage": True}
        assert arguments["extra_body"] == {"min_tokens": shape.output_tokens, "ignore_eos": True}
    assert [(r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in requests] == [
        (100, 64, program.shapes[0].output_tokens),
        (200, 64, program.shapes[1].output_tokens),
    ]
    for request in requests:
        assert request.first_token_s is not None
        assert 0 <= request.first_token_s <= request.latency_s
        assert request.replica == "replica-0" and request.first_result_s is None
    assert program.messages[1]["content"] == " x" * program.shapes[0].output_tokens

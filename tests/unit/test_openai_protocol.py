"""Reading OpenAI's wire format: tool calls of messages, replies and streamed
chunks, and toolserve's extension."""

from __future__ import annotations

from cluster.openai_protocol import (
    ModelToolCall,
    ToolCallDeltas,
    executed_messages,
    message_tool_calls,
    reply_tool_calls,
    sse_event,
    sse_payloads,
    with_executed_messages,
)


def test_message_calls_are_read_leniently() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "function": {"name": "ls", "arguments": '{"path": "."}'}},
            {"id": "b", "function": {"arguments": "{}"}},  # no name: skipped
            {"function": {"name": "add", "arguments": {"x": 1}}},  # an object, not text
            "not a call",
        ],
    }
    assert message_tool_calls(message) == [
        ModelToolCall("a", "ls", '{"path": "."}'),
        ModelToolCall("", "add", '{"x": 1}'),
    ]
    assert message_tool_calls(None) == []


def test_a_reply_and_its_extension() -> None:
    executed = [{"role": "tool", "tool_call_id": "a", "content": "42"}]
    reply = with_executed_messages(
        {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f"}}]}}]},
        executed,
    )
    assert reply_tool_calls(reply) == [ModelToolCall("c", "f", "")]
    assert executed_messages(reply) == executed
    assert executed_messages(None) == []


def test_streamed_calls_are_reassembled_from_their_deltas() -> None:
    chunks = [
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}}
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
    ]
    deltas = ToolCallDeltas()
    for data in sse_payloads("".join(sse_event(chunk) for chunk in chunks) + "data: [DONE]\n\n"):
        deltas.feed_chunk(data)
    assert deltas.calls() == [ModelToolCall("c", "f", '{"a": 1}')]


def test_only_chunks_with_call_fragments_are_parsed() -> None:
    deltas = ToolCallDeltas()
    deltas.feed_sse(sse_event({"choices": [{"delta": {"content": "hi"}}]}))
    deltas.feed_sse("data: [DONE]\n\n")
    deltas.feed_sse("data: {not json, and no call fragment\n\n")
    assert not deltas
    deltas.feed_sse(
        sse_event(
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "g"}}]}}]}
        )
    )
    assert deltas.calls() == [ModelToolCall("", "g", "")]

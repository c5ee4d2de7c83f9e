"""Reading OpenAI's wire format: tool calls of messages, replies and streamed
chunks, toolserve's extension, and the reply a stream adds up to."""

from __future__ import annotations

from cluster.openai_protocol import (
    EXTENSION_FIELD,
    PREDICTED_CALLS_ARG,
    ModelToolCall,
    StreamedReply,
    ToolCallDeltas,
    executed_messages,
    message_tool_calls,
    reply_tool_calls,
    sse_event,
    sse_payloads,
    with_executed_messages,
    with_predicted_calls,
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


def test_a_stream_adds_up_to_the_non_streamed_reply() -> None:
    head = {"id": "chatcmpl-1", "created": 7, "model": "m"}
    executed = [{"role": "tool", "tool_call_id": "c0", "content": "2"}]
    chunks = [
        head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Su"}}]},
        head | {"choices": [{"index": 0, "delta": {"content": "re."}}]},
        head | {"choices": [], EXTENSION_FIELD: {"executed_messages": executed}},
        head
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]},
                }
            ]
        },
        head
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
        head | {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    streamed = StreamedReply()
    for chunk in chunks:
        streamed.feed_sse(sse_event(chunk))
    streamed.feed_sse("data: [DONE]\n\n")
    body = streamed.body()
    assert body["id"] == "chatcmpl-1" and body["model"] == "m" and body["created"] == 7
    (choice,) = body["choices"]
    assert choice["message"]["content"] == "Sure."
    assert reply_tool_calls(body) == [ModelToolCall("c1", "f", "{}")]
    assert choice["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert executed_messages(body) == executed
    assert streamed.error is None


def test_an_error_in_the_stream_is_kept() -> None:
    streamed = StreamedReply()
    streamed.feed_sse(sse_event({"error": {"message": "boom", "code": 500}}))
    assert streamed.error == {"message": "boom", "code": 500}


def test_only_the_servers_predicted_calls_reach_the_engine() -> None:
    sent = {PREDICTED_CALLS_ARG: ['{"name": "x"}'] * 1000, "toolserve_last_step": 1}
    assert with_predicted_calls(sent, []) == {"toolserve_last_step": 1}
    assert with_predicted_calls(sent, ['{"name": "f"}']) == {
        "toolserve_last_step": 1,
        PREDICTED_CALLS_ARG: ['{"name": "f"}'],
    }
    assert with_predicted_calls(None, []) is None
    assert with_predicted_calls({PREDICTED_CALLS_ARG: []}, []) is None

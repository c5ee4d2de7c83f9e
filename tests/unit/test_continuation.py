"""Engine-side continuation: which requests may continue, the next round's request,
usage sums, the streamed round (held tool calls), and the round loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from cluster.config import HostedToolConfig, ToolsConfig
from cluster.openai_protocol import EXTENSION_FIELD, ModelToolCall, message_tool_calls
from cluster.store.tool_state import LocalToolStateStore
from deployments.replica.continuation import (
    Continuation,
    StreamRound,
    TurnContext,
    continuation_possible,
    declared_hosted_tools,
    next_round_body,
    round_messages,
    summed_usage,
)
from toolworkers.execution import ToolExecutor
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "What is 6*7?"}],
    "tools": TOOLS,
    "request_id": "abc",
}


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, chunk_id: str = "x") -> str:
    return _sse(
        {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _events(chunks: list[str]) -> list[dict[str, Any] | str]:
    events: list[dict[str, Any] | str] = []
    for chunk in chunks:
        payload = chunk.removeprefix("data: ").strip()
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_single_choice_requests_whose_model_may_call_tools_continue() -> None:
    tools = BODY["tools"]
    assert continuation_possible(tools, None, "auto")
    assert continuation_possible(tools, 1, "auto")
    assert continuation_possible(tools, 1, "required")
    assert continuation_possible(tools, 1, {"type": "function", "function": {"name": "calculator"}})
    assert not continuation_possible(tools, 1, "none")
    assert not continuation_possible(tools, 2, "auto")
    assert not continuation_possible(None, 1, "auto")
    assert not continuation_possible([], 1, "auto")


def test_round_messages_keep_call_order_and_ids() -> None:
    calls = [
        ModelToolCall("c1", "calculator", '{"expression": "6*7"}'),
        ModelToolCall("c2", "f", ""),
    ]
    messages = round_messages("Let me compute.", calls, ["42", "error: boom"])
    assert messages[0] == {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [call.as_message_part() for call in calls],
    }
    assert messages[1:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "tool", "tool_call_id": "c2", "content": "error: boom"},
    ]
    assert round_messages("", calls[:1], ["42"])[0]["content"] is None


def test_the_calls_of_a_reply_message_are_read() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
        ],
    }
    assert message_tool_calls(message) == [ModelToolCall("c1", "calculator", "{}")]
    assert message_tool_calls({"role": "assistant", "content": "hi"}) == []


def test_next_round_appends_messages_and_spends_the_token_budget() -> None:
    executed = [{"role": "tool", "tool_call_id": "c1", "content": "42"}]
    constrained = BODY | {
        "max_tokens": 100,
        "tool_choice": "required",
        "structured_outputs": {"regex": "x"},
        "response_format": {"type": "json_object"},
    }
    following = next_round_body(constrained, executed, 30, 1)
    assert following is not None
    assert "tool_choice" not in following and "structured_outputs" not in following
    assert following["response_format"] == {"type": "json_object"}
    assert following["messages"] == BODY["messages"] + executed
    assert following["max_tokens"] == 70
    assert following["request_id"] == "abc-r1"
    assert BODY["messages"] == [{"role": "user", "content": "What is 6*7?"}]
    assert next_round_body(BODY | {"max_completion_tokens": 30}, executed, 30, 1) is None
    unbounded = next_round_body(BODY, executed, 500, 2)
    assert unbounded is not None and "max_tokens" not in unbounded


def test_usage_sums_over_rounds() -> None:
    first = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    second = {
        "prompt_tokens": 140,
        "completion_tokens": 10,
        "total_tokens": 150,
        "prompt_tokens_details": {"cached_tokens": 128},
    }
    total = summed_usage(summed_usage(None, first), second)
    assert total == {
        "prompt_tokens": 240,
        "completion_tokens": 30,
        "total_tokens": 270,
        "prompt_tokens_details": {"cached_tokens": 128},
    }
    assert first["prompt_tokens"] == 100
    assert summed_usage(total, None) == total


def _tool_round(stream: StreamRound) -> list[str]:
    forwarded: list[str] = []
    for chunk in [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "compute."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"expression": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"6*7"}'}}]}),
        _chunk({}, finish="tool_calls"),
        _sse({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": {"a": 1}}),
        "data: [DONE]\n\n",
    ]:
        forwarded += stream.feed(chunk)
    return forwarded


def test_a_streamed_round_forwards_content_and_holds_tool_calls() -> None:
    stream = StreamRound("chatcmpl-abc")
    events = _events(_tool_round(stream))
    assert all(isinstance(event, dict) and event["id"] == "chatcmpl-abc" for event in events)
    deltas = [event["choices"][0]["delta"] for event in events if isinstance(event, dict)]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Let me "},
        {"content": "compute."},
    ]
    assert stream.content == "Let me compute."
    assert stream.finish_reason == "tool_calls"
    assert stream.tool_calls == [ModelToolCall("c1", "calculator", '{"expression": "6*7"}')]
    assert stream.usage == {"a": 1}


def test_a_round_going_to_the_client_closes_with_whole_calls() -> None:
    stream = StreamRound("chatcmpl-abc")
    _tool_round(stream)
    events = _events(stream.closing_chunks({"a": 3}))
    assert events[-1] == "[DONE]"
    calls, finish, usage = events[:-1]
    assert isinstance(calls, dict) and isinstance(finish, dict) and isinstance(usage, dict)
    assert calls["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "c1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
        }
    ]
    assert finish["choices"][0]["finish_reason"] == "tool_calls"
    assert usage["usage"] == {"a": 3} and usage["choices"] == []
    without_usage = _events(stream.closing_chunks(None))
    assert len(without_usage) == 3


def test_a_round_the_server_answered_shows_its_messages() -> None:
    stream = StreamRound("chatcmpl-abc")
    _tool_round(stream)
    messages = round_messages(stream.content, stream.tool_calls, ["42"])
    event = _events([stream.executed_chunk(messages)])[0]
    assert isinstance(event, dict)
    assert event["id"] == "chatcmpl-abc"
    assert event["choices"][0]["delta"] == {} and event["choices"][0]["finish_reason"] is None
    assert event[EXTENSION_FIELD]["executed_messages"] == messages


def test_a_final_chunk_with_content_is_sent_once() -> None:
    stream = StreamRound("chatcmpl-abc")
    forwarded = stream.feed(_chunk({"content": "Done."}, finish="stop"))
    assert [event["choices"][0] for event in _events(forwarded) if isinstance(event, dict)] == [
        {"index": 0, "delta": {"content": "Done."}, "finish_reason": None}
    ]
    closing = _events(stream.closing_chunks(None))
    assert isinstance(closing[0], dict)
    assert closing[0]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert closing[1] == "[DONE]"


def test_an_error_event_is_forwarded_and_marks_the_round_failed() -> None:
    stream = StreamRound("chatcmpl-abc")
    forwarded = stream.feed(_sse({"error": {"message": "boom", "code": 500}}))
    assert stream.failed
    assert _events(forwarded) == [{"error": {"message": "boom", "code": 500}}]


def test_only_tools_declared_with_the_hosted_schema_run_in_the_server() -> None:
    hosted = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate.",
                "parameters": {"type": "object", "properties": {"e": {"type": "string"}}},
            },
        }
    ]
    same = json.loads(json.dumps(hosted[0]))
    same["function"]["parameters"] = {"properties": {"e": {"type": "string"}}, "type": "object"}
    own = json.loads(json.dumps(hosted[0]))
    own["function"]["description"] = "My own calculator."
    other = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    assert declared_hosted_tools([same, other], hosted) == {"calculator"}
    assert declared_hosted_tools([own, other], hosted) == set()
    assert declared_hosted_tools([{"type": "function"}, "junk"], hosted) == set()  # type: ignore[list-item]


# --- the round loop, with the real executor and calculator, the engine scripted --


class _Reply(dict[str, Any]):
    """A non-streamed engine reply as vLLM's front end returns it."""

    def model_dump(self, mode: str) -> dict[str, Any]:
        return json.loads(json.dumps(self))


def _reply(message: dict[str, Any], finish: str, completion_tokens: int) -> _Reply:
    return _Reply(
        id="chatcmpl-round",
        choices=[{"index": 0, "message": message, "finish_reason": finish}],
        usage={"prompt_tokens": 10, "completion_tokens": completion_tokens, "total_tokens": 0},
    )


CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
}


def _continuation(
    create: Any,
    body: dict[str, Any],
    turn_ends: list[str | None],
    hosted: str = "toolworkers.hosted_tools:calculator",
) -> Continuation:
    config = ToolsConfig(hosted=[HostedToolConfig(function=hosted)])
    registry = ToolRegistry.from_config(config)

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, config.sandbox)

    executor = ToolExecutor(registry, sandboxed, None, config.cache, LocalToolStateStore(60))
    hosted_body = body | {"tools": registry.openai_schemas(), "session_id": "p1"}
    return Continuation(
        hosted_body,
        TurnContext(tenant="t", execute_tools=True),
        executor,
        config.continuation,
        create,
        turn_ends.append,
    )


def test_the_loop_answers_hosted_calls_and_runs_the_next_round() -> None:
    sent: list[dict[str, Any]] = []

    async def create(body: dict[str, Any]) -> _Reply:
        sent.append(body)
        return _reply({"role": "assistant", "content": "It is 42."}, "stop", 5)

    turn_ends: list[str | None] = []
    continuation = _continuation(create, BODY | {"max_tokens": 50}, turn_ends)
    first = _reply({"role": "assistant", "content": None, "tool_calls": [CALL]}, "tool_calls", 20)
    reply = asyncio.run(continuation.reply(first.model_dump(mode="json")))

    assert len(sent) == 1 and sent[0]["max_tokens"] == 30 and sent[0]["request_id"] == "abc-r1"
    executed = reply[EXTENSION_FIELD]["executed_messages"]
    assert executed == sent[0]["messages"][len(BODY["messages"]) :]
    assert executed[1] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert reply["choices"][0]["message"]["content"] == "It is 42."
    assert reply["usage"]["completion_tokens"] == 25
    assert turn_ends == ["calculator", None]


def test_calls_on_a_programs_tool_state_run_in_the_order_the_model_wrote_them() -> None:
    sent: list[dict[str, Any]] = []

    async def create(body: dict[str, Any]) -> _Reply:
        sent.append(body)
        return _reply({"role": "assistant", "content": "Done."}, "stop", 2)

    calls = [
        {"id": f"c{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for index, (name, arguments) in enumerate(
            [("mkdir", '{"dir_name": "docs"}'), ("cd", '{"folder": "docs"}'), ("pwd", "{}")]
        )
    ]
    continuation = _continuation(
        create, BODY | {"max_tokens": 50}, [], "toolworkers.bfcl_tools:GorillaFileSystem"
    )
    first = _reply({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls", 20)
    asyncio.run(continuation.reply(first.model_dump(mode="json")))
    answers = {m["tool_call_id"]: m["content"] for m in sent[0]["messages"] if m["role"] == "tool"}
    # `pwd` only reads the state, so it runs without the program's lock: only the
    # order keeps it after the `cd`.
    assert json.loads(answers["c2"])["current_working_directory"].endswith("/docs")


def test_a_call_of_a_client_tool_goes_back_to_the_client() -> None:
    async def create(body: dict[str, Any]) -> _Reply:
        raise AssertionError("no round may follow a call the server cannot answer")

    continuation = _continuation(create, BODY, [])
    weather = CALL | {"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    first = _reply({"role": "assistant", "content": None, "tool_calls": [weather]}, "tool_calls", 9)
    reply = asyncio.run(continuation.reply(first.model_dump(mode="json")))
    assert reply == first.model_dump(mode="json")


def test_a_streamed_turn_shows_the_executed_round_then_the_answer() -> None:
    async def following_round() -> AsyncIterator[str]:
        yield _chunk({"content": "42."}, finish="stop")
        yield "data: [DONE]\n\n"

    async def create(body: dict[str, Any]) -> AsyncIterator[str]:
        return following_round()

    async def first_round() -> AsyncIterator[str]:
        yield _chunk({"tool_calls": [{"index": 0} | CALL]})
        yield _chunk({}, finish="tool_calls")
        yield "data: [DONE]\n\n"

    turn_ends: list[str | None] = []
    continuation = _continuation(create, BODY, turn_ends)

    async def collect() -> list[str]:
        return [chunk async for chunk in continuation.stream(first_round(), False)]

    events = _events(asyncio.run(collect()))
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    executed = [e for e in events if isinstance(e, dict) and EXTENSION_FIELD in e]
    assert len(executed) == 1
    messages = executed[0][EXTENSION_FIELD]["executed_messages"]
    assert messages[1]["content"] == "42"
    contents = [
        e["choices"][0]["delta"].get("content")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    ]
    assert "42." in contents
    assert all(e["id"] == "chatcmpl-abc" for e in events if isinstance(e, dict))
    assert turn_ends == ["calculator", None]
    assert continuation.calls_made == [ModelToolCall("c1", "calculator", '{"expression": "6*7"}')]


# --- invalid calls stopped while they stream ---------------------------------


def _usage_chunk(delta: dict[str, Any], completion_tokens: int) -> str:
    """A chunk as vLLM streams it with `continuous_usage_stats`."""
    payload = json.loads(_chunk(delta).removeprefix("data: "))
    usage = {"prompt_tokens": 10, "completion_tokens": completion_tokens, "total_tokens": 0}
    return _sse(payload | {"usage": usage})


def _call_fragments(index: int, name: str, arguments: str) -> list[dict[str, Any]]:
    """A call as vLLM's tool parser streams it: the name first, then its text."""
    head = {"index": index, "id": f"c{index}", "type": "function", "function": {"name": name}}
    return [head] + [
        {"index": index, "function": {"arguments": arguments[at : at + 4]}}
        for at in range(0, len(arguments), 4)
    ]


class _ScriptedRound:
    """A round's engine stream that records how far it was read and whether the
    reader closed it (closing is what aborts vLLM's request)."""

    def __init__(self, chunks: list[str]):
        self.chunks = chunks
        self.sent = 0
        self.closed = False

    async def stream(self) -> AsyncIterator[str]:
        try:
            for chunk in self.chunks:
                self.sent += 1
                yield chunk
        finally:
            self.closed = True


def _streamed_call_turn(
    fragments: list[dict[str, Any]],
    body: dict[str, Any],
    stop_invalid_calls: bool | None = None,
    client_tools: list[dict[str, Any]] | None = None,
    stream_client_calls: bool | None = None,
) -> tuple[list[dict[str, Any] | str], _ScriptedRound, list[dict[str, Any]]]:
    """Streams a turn whose first round writes `fragments` (one token each) and
    whose next round answers; returns the client's events, the first round's
    stream and the requests of the rounds that followed."""
    first = _ScriptedRound(
        [_usage_chunk({"content": "Let me see."}, 3)]
        + [
            _usage_chunk({"tool_calls": [fragment]}, 4 + at)
            for at, fragment in enumerate(fragments)
        ]
        + [
            _usage_chunk({}, 4 + len(fragments)),
            _chunk({}, finish="tool_calls"),
            "data: [DONE]\n\n",
        ]
    )
    sent: list[dict[str, Any]] = []

    async def following_round() -> AsyncIterator[str]:
        yield _chunk({"content": "Done."}, finish="stop")
        yield "data: [DONE]\n\n"

    async def create(next_body: dict[str, Any]) -> AsyncIterator[str]:
        sent.append(next_body)
        return following_round()

    continuation = _continuation(create, body, [])
    continuation._body["tools"] += client_tools or []
    continuation._turn = TurnContext(
        tenant="t",
        execute_tools=True,
        stop_invalid_calls=stop_invalid_calls,
        stream_client_calls=stream_client_calls,
    )

    async def collect() -> list[str]:
        return [chunk async for chunk in continuation.stream(first.stream(), False)]

    return _events(asyncio.run(collect())), first, sent


def _tool_message(body: dict[str, Any]) -> str:
    return str(next(m for m in body["messages"] if m["role"] == "tool")["content"])


def test_a_hosted_call_with_an_argument_its_schema_rejects_is_stopped_and_written_again() -> None:
    fragments = _call_fragments(0, "calculator", '{"expression": 42, "precision": 3}')
    events, first, sent = _streamed_call_turn(fragments, BODY | {"max_tokens": 50})

    assert first.closed and first.sent < len(first.chunks) - 2  # stopped, not read out
    assert len(sent) == 1
    assistant = sent[0]["messages"][-2]
    assert assistant["content"] == "Let me see."
    # Cut inside its object, the call keeps the arguments written whole.
    assert assistant["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": '{"expression": 42}',
    }
    assert _tool_message(sent[0]).startswith("error: invalid call, stopped while it was written")
    assert "'expression'" in _tool_message(sent[0])
    # The stopped round's tokens, known from its last chunk's usage (the content's
    # chunk, then one per fragment from 4 tokens on), count against the budget.
    assert sent[0]["max_tokens"] == 50 - (4 + first.sent - 2)
    contents = [e["choices"][0]["delta"].get("content") for e in events if isinstance(e, dict)]
    assert "Done." in contents
    assert not any("usage" in e for e in events if isinstance(e, dict) and e.get("choices"))


def test_a_call_of_an_undeclared_tool_is_stopped_at_its_name() -> None:
    fragments = _call_fragments(0, "get_stock_price", '{"ticker": "ACME"}')
    _events_seen, first, sent = _streamed_call_turn(fragments, BODY)
    assert first.closed
    assert first.sent == 2  # the content, then the name: nothing of its arguments
    assert "declares no tool 'get_stock_price'" in _tool_message(sent[0])


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _call_deltas(events: list[dict[str, Any] | str]) -> list[list[dict[str, Any]]]:
    return [
        e["choices"][0]["delta"]["tool_calls"]
        for e in events
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("tool_calls")
    ]


def test_a_client_tools_call_streams_as_it_is_written_and_goes_to_the_client() -> None:
    fragments = _call_fragments(0, "get_weather", '{"city": "Oslo"}')
    events, first, sent = _streamed_call_turn(fragments, BODY, client_tools=[WEATHER])
    assert not sent and first.sent == len(first.chunks)
    deltas = _call_deltas(events)
    # One event per fragment, as the engine wrote them: the name first, then the
    # arguments' text; nothing sent again whole at the end.
    assert deltas == [[fragment] for fragment in fragments]
    assert "".join(d[0]["function"].get("arguments", "") for d in deltas) == '{"city": "Oslo"}'
    finishes = [
        e["choices"][0]["finish_reason"]
        for e in events
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
    ]
    assert finishes == ["tool_calls"] and events[-1] == "[DONE]"


def test_a_declared_client_tools_call_goes_whole_to_the_client_when_held() -> None:
    fragments = _call_fragments(0, "get_weather", '{"city": 7}')
    events, first, sent = _streamed_call_turn(
        fragments, BODY, client_tools=[WEATHER], stream_client_calls=False
    )
    assert not sent and first.sent == len(first.chunks)
    (calls,) = _call_deltas(events)
    assert calls[0]["function"]["arguments"] == '{"city": 7}'


def test_the_rounds_first_call_decides_whether_its_calls_stream() -> None:
    hosted_first = StreamRound("chatcmpl-abc", client_tools=frozenset({"get_weather"}))
    client_first = StreamRound("chatcmpl-abc", client_tools=frozenset({"get_weather"}))
    calculator = _call_fragments(0, "calculator", '{"expression": "6*7"}')
    weather = _call_fragments(1, "get_weather", '{"city": "Oslo"}')
    held = [hosted_first.feed(_chunk({"tool_calls": [f]})) for f in calculator + weather]
    assert not any(held) and not hosted_first.forwards_calls
    reordered = [{**f, "index": 1 - f["index"]} for f in weather + calculator]
    sent = [client_first.feed(_chunk({"tool_calls": [f]})) for f in reordered]
    assert all(sent) and client_first.forwards_calls
    assert len(client_first.tool_calls) == 2


def test_with_stopping_off_the_call_is_written_out_and_run() -> None:
    fragments = _call_fragments(0, "calculator", '{"expression": 42}')
    _events_seen, first, sent = _streamed_call_turn(fragments, BODY, stop_invalid_calls=False)
    assert first.sent == len(first.chunks)
    assert sent[0]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == (
        '{"expression": 42}'
    )
    assert "stopped while it was written" not in _tool_message(sent[0])


def test_a_stopped_call_without_budget_for_another_round_ends_the_reply_without_it() -> None:
    fragments = _call_fragments(0, "calculator", '{"expression": 42, "precision": 3}')
    events, first, sent = _streamed_call_turn(fragments, BODY | {"max_tokens": 6})
    assert first.closed and not sent
    finishes = [
        e["choices"][0]["finish_reason"]
        for e in events
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
    ]
    assert finishes == ["stop"]
    assert not any(
        e["choices"][0]["delta"].get("tool_calls")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )
    assert events[-1] == "[DONE]"

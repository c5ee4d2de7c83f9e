"""The client-agents workload: its agents, what the wire recorder reads under the
client libraries, and the prefix-held figures computed from the records."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import httpx2
import pytest

from bench.client_agents import (
    LIBRARY_LOOPS,
    Connection,
    Exchange,
    Target,
    WireRecorder,
    exchange_records,
)
from bench.prefix_hold import prefix_hold, prefix_outcome, returning_requests
from bench.records import RequestRecord
from bench.workloads import plan_workload
from bench.workloads.client_agents import (
    CLIENT_LIBRARIES,
    CLIENT_TOOL_SCHEMAS,
    HOSTED_TOOL,
    SIZE_CONFIGS,
    ClientLibrary,
    hosted_tool_schema,
    run_tool,
)
from cluster.config import load_config
from deployments.replica.continuation import declared_hosted_tools
from toolworkers.registry import ToolRegistry


def test_every_library_streaming_choice_and_placement_gets_its_programs() -> None:
    config = SIZE_CONFIGS["default"]
    agents = config.agents(seed=3)
    kinds = {agent.agent_type for agent in agents}
    assert len(kinds) == 3 * 2 * 2
    assert len(agents) == len(kinds) * config.programs_per_kind
    assert len({agent.program_id for agent in agents}) == len(agents)
    assert all(len(agent.questions) == config.questions for agent in agents)
    assert [a.questions for a in config.agents(seed=3)] == [a.questions for a in agents]
    assert [a.questions for a in config.agents(seed=4)] != [a.questions for a in agents]


def test_the_hosted_placement_declares_the_tool_as_the_default_profile_hosts_it() -> None:
    hosted = ToolRegistry.from_config(load_config(None).tools).openai_schemas()
    assert declared_hosted_tools([hosted_tool_schema()], hosted) == {HOSTED_TOOL}
    assert declared_hosted_tools(CLIENT_TOOL_SCHEMAS, hosted) == set()
    plan = plan_workload("client-agents", "quick")
    assert plan.client_agents is not None and not plan.build(0)


def test_the_agents_tools_answer_errors_as_text() -> None:
    assert run_tool(HOSTED_TOOL, {"expression": "2 * (3 + 4)"}) == "14"
    assert run_tool(HOSTED_TOOL, {"expression": "2.15 EUR"}).startswith("Error:")
    assert run_tool("lookup_order", {}).startswith("Error:")
    assert run_tool("delete_order", {"order_id": "A-1"}).startswith("Error:")
    assert "Leeds" in run_tool("check_stock", {"item": "webcam"})


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def _recorded(body: bytes, content_type: str, headers: dict[str, str] | None = None) -> Exchange:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": content_type, **(headers or {})}, content=body
        )

    recorder = WireRecorder()
    recorder._inner = httpx2.MockTransport(answer)  # type: ignore[assignment]

    async def send() -> bytes:
        async with httpx2.AsyncClient(transport=recorder) as client:
            response = await client.post("http://server/v1/chat/completions", json={})
            await client.get("http://server/v1/models")
            return response.content

    assert asyncio.run(send()) == body  # the library gets the body untouched
    (exchange,) = recorder.exchanges  # only chat completions are kept
    return exchange


def test_a_streamed_reply_is_read_on_its_way_to_the_library() -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": 832},
    }
    call = {"index": 0, "id": "c1", "function": {"name": "lookup_order", "arguments": ""}}
    executed = {
        "executed_messages": [
            {"role": "assistant", "tool_calls": [{"id": "h1"}, {"id": "h2"}]},
            {"role": "tool", "tool_call_id": "h1", "content": "4"},
        ]
    }
    body = _sse(
        {"choices": [], "toolserve": executed},
        {"choices": [{"delta": {"tool_calls": [call]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": usage},
    )
    exchange = _recorded(body, "text/event-stream", {"X-Toolserve-Prefix": "held; tokens=870"})
    assert exchange.usage == usage
    assert (exchange.tool_calls, exchange.server_ran_calls, exchange.server_ran_rounds) == (1, 2, 1)
    assert exchange.finish_reason == "tool_calls"
    assert exchange.first_token is not None and exchange.finished is not None
    assert exchange.headers["x-toolserve-prefix"] == "held; tokens=870"


def test_a_whole_reply_is_read_once_the_library_has_it() -> None:
    reply = {
        "choices": [
            {"message": {"content": "It ships today.", "tool_calls": None}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    exchange = _recorded(json.dumps(reply).encode(), "application/json")
    assert (exchange.tool_calls, exchange.finish_reason, exchange.usage) == (
        0,
        "stop",
        reply["usage"],
    )
    target = Target("http://server/v1", "m", "toolserve", 0)
    agent = SIZE_CONFIGS["quick"].agents(0)[0]
    (record,) = exchange_records(target, agent, [exchange], exchange.sent)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, None, 5)
    assert record.agent_type == agent.agent_type and record.error is None
    # A whole reply's time is its latency; only a streamed one has a first token.
    assert exchange.first_token is None and record.first_token_s is None


def _request(
    turn: int, prompt: int, cached: int | None, completion: int, **fields: Any
) -> RequestRecord:
    values: dict[str, Any] = {
        "system": "s",
        "repeat": 0,
        "program_id": "p",
        "agent_type": "openai/plain/client",
        "turn_index": turn,
        "sent_s": float(turn),
        "latency_s": 1.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "finish_reason": "stop",
        "tool_calls": 0,
        "unusable_calls": 0,
        "tool_latency_s": 0.0,
    }
    return RequestRecord(**(values | fields))


def test_a_returning_request_is_measured_against_what_the_engine_held() -> None:
    requests = [
        _request(0, 1300, 0, 41),
        _request(
            1, 1400, 1216, 20, prefix="broken; cause=history_edited; position=1290; recomputed=50"
        ),
        _request(
            2,
            1500,
            1408,
            20,
            prefix="repaired; cause=assistant_rerendered; position=1400; recomputed=0",
        ),
        _request(3, 1600, None, 20, error="APIError: boom"),
        _request(4, 1700, 1600, 20),  # its previous request failed: not measured
    ]
    pairs = returning_requests(requests)
    assert [pair.request.turn_index for pair in pairs] == [1, 2]
    first = pairs[0]
    assert first.held_context == 1340  # the reply's last token is never computed
    assert first.held_share() == pytest.approx(1216 / 1340)
    assert first.held_share_of_blocks(64) == pytest.approx(1216 / 1280)
    assert first.recomputed_tokens == 184
    figures = prefix_hold(requests, block_size=64)["all"]
    assert figures["returning_requests"] == 2
    assert figures["at_target_share"] == pytest.approx(0.5)  # 1216/1340 < 95% <= 1408/1419
    assert figures["prefix_checks"] == {
        "broken: history_edited": 1,
        "repaired: assistant_rerendered": 1,
    }


def test_a_previous_request_the_server_continued_is_not_a_share() -> None:
    requests = [
        _request(0, 2500, 0, 40, server_ran_calls=1),
        _request(1, 1400, 1280, 20),
    ]
    (pair,) = returning_requests(requests)
    assert pair.held_share() is None and pair.held_share_of_blocks(64) is None
    figures = prefix_hold(requests, block_size=64)
    assert figures["all"]["measured_requests"] == 0
    assert figures["by_agent_type"]["openai/plain/client"]["recomputed_tokens_mean"] == 120


def test_prefix_outcomes_are_read_from_the_header() -> None:
    assert prefix_outcome(None) is None
    assert prefix_outcome("held; tokens=12") == "held"
    assert prefix_outcome("broken; cause=tools_changed; position=3; recomputed=9") == (
        "broken: tools_changed"
    )


@pytest.mark.parametrize("library", CLIENT_LIBRARIES)
@pytest.mark.parametrize("stream", [False, True])
def test_a_question_ends_after_its_tool_steps_whatever_the_library(
    library: ClientLibrary, stream: bool
) -> None:
    """A model that calls a tool on every turn: each library's loop stops the
    question after `max_tool_steps` requests and goes on to the next question."""
    config = SIZE_CONFIGS["quick"].model_copy(update={"max_tool_steps": 2})
    agent = replace(
        next(a for a in config.agents(0) if a.placement == "client"),
        library=library,
        stream=stream,
    )
    arguments = json.dumps({"item": "webcam"})
    call: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "check_stock"}}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    requests: list[dict[str, Any]] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        requests.append(json.loads(request.content))
        if not requests[-1].get("stream"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call | {"function": call["function"] | {"arguments": arguments}}],
            }
            reply = {
                "id": "r",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": usage,
            }
            return httpx2.Response(200, json=reply)
        head = {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        delta = {"role": "assistant", "tool_calls": [call | {"index": 0}]}
        more = {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
        body = _sse(
            head | {"choices": [{"index": 0, "delta": delta}]},
            head | {"choices": [{"index": 0, "delta": more}]},
            head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            head | {"choices": [], "usage": usage},
        )
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async def run() -> None:
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http:
            connection = Connection("http://server/v1", "m", "session", http)
            await LIBRARY_LOOPS[agent.library](agent, config, connection)

    asyncio.run(run())
    assert len(requests) == len(agent.questions) * config.max_tool_steps
    last_question = agent.questions[-1]
    assert any(message.get("content") == last_question for message in requests[-1]["messages"])

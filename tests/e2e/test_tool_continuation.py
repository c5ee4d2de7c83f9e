"""Hosted tools and engine-side continuation on the shared cluster: the model's
call of a hosted tool runs on the tool workers and the turn continues in the
replica; a client's posted output answers its own tool; `/cache-tool-output`
and its errors. Real Ray, Redis, vLLM (SmolLM2) and the `openai` SDK."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_text import histogram_buckets, metric_total
from written_calls import LEAD, invalid_calculator_call, written_turn

from cluster.launch.demo import WORKSPACE_FILES, run_demo
from cluster.launch.launcher import Endpoints
from toolworkers import plan_tool
from toolworkers.builtin_tools import calculate

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is 1234 * 5678?"}]


def _hosted_tools(cluster: Endpoints) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.api_base}/tools", timeout=30)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def _calculator_turn(client: OpenAI, model: str, cluster: Endpoints, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=[t for t in _hosted_tools(cluster) if t["function"]["name"] == "calculator"],
        tool_choice="required",
        temperature=0,
        max_tokens=96,
        **extra,
    )


def test_hosted_tools_are_listed(cluster: Endpoints) -> None:
    names = {tool["function"]["name"] for tool in _hosted_tools(cluster)}
    assert {"calculator", "read_file", "list_files"} <= names


def test_a_hosted_call_runs_in_the_cluster_and_the_turn_continues(
    client: OpenAI, model_name: str, cluster: Endpoints, healthy_after: None
) -> None:
    response = _calculator_turn(client, model_name, cluster)
    extension = (response.model_extra or {}).get("toolserve")
    assert extension is not None, "the server should have answered the calculator call"
    call_message, tool_message = extension["executed_messages"]
    (call,) = call_message["tool_calls"]
    assert call_message["role"] == "assistant" and call["function"]["name"] == "calculator"
    expression = json.loads(call["function"]["arguments"])["expression"]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": calculate(expression),
    }
    final = response.choices[0]
    assert not final.message.tool_calls, "the second round is free to answer"
    assert final.message.content
    assert response.usage is not None and response.usage.completion_tokens > 0


def test_execute_tools_false_hands_the_call_to_the_client(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    response = _calculator_turn(
        client, model_name, cluster, extra_body={"toolserve": {"execute_tools": False}}
    )
    assert "toolserve" not in (response.model_extra or {})
    (call,) = response.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "calculator"


def test_a_streamed_continuation_matches_the_non_streamed_one(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    whole = _calculator_turn(client, model_name, cluster)
    stream = _calculator_turn(
        client, model_name, cluster, stream=True, stream_options={"include_usage": True}
    )
    ids, executed, content, finish, usage = set(), [], "", None, None
    for chunk in stream:
        ids.add(chunk.id)
        executed += ((chunk.model_extra or {}).get("toolserve") or {}).get("executed_messages", [])
        usage = chunk.usage or usage
        if chunk.choices:
            assert not chunk.choices[0].delta.tool_calls
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish

    def without_ids(messages: list[dict[str, Any]]) -> list[Any]:
        return [
            (
                m["role"],
                m.get("content"),
                [
                    (c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in m.get("tool_calls") or []
                ],
            )
            for m in messages
        ]

    whole_extension = (whole.model_extra or {})["toolserve"]
    assert len(ids) == 1
    assert without_ids(executed) == without_ids(whole_extension["executed_messages"])
    assert content == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


def _calls_stopped(cluster: Endpoints) -> float:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return metric_total(text, "toolserve_tool_calls_stopped_total", reason="bad_argument")


def _written_turn(
    client: OpenAI,
    model: str,
    cluster: Endpoints,
    tool: str,
    call: str,
    options: dict[str, Any] | None = None,
    stream: bool = True,
) -> list[dict[str, Any]]:
    tools = [t for t in _hosted_tools(cluster) if t["function"]["name"] == tool]
    return written_turn(client, model, QUESTION, tools, call, options, stream)


def test_a_streamed_call_that_cannot_be_valid_is_stopped_and_written_again(
    client: OpenAI, model_name: str, cluster: Endpoints, healthy_after: None
) -> None:
    """The model is made to write a calculator call whose first argument is a
    number (structured outputs fix its text; vLLM's hermes parser streams it as a
    call): decoding stops there (the server closes the engine's stream, which
    aborts vLLM's request) and the next round sees the call and why it was
    stopped."""
    stopped_before = _calls_stopped(cluster)
    executed = _written_turn(client, model_name, cluster, "calculator", invalid_calculator_call())
    call_message, tool_message = executed[:2]
    (call,) = call_message["tool_calls"]
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": 42}'}
    assert tool_message["tool_call_id"] == call["id"]
    assert tool_message["content"].startswith("error: invalid call, stopped while it was written")

    deadline = time.monotonic() + 60
    while _calls_stopped(cluster) <= stopped_before and time.monotonic() < deadline:
        time.sleep(1)
    assert _calls_stopped(cluster) > stopped_before, "the stop never showed in the metrics"


def _overlapped_beyond(cluster: Endpoints, seconds: float) -> float:
    """Calls run on partial input whose tool worked over `seconds` while the model
    was still writing them."""
    text = httpx.get(cluster.metrics_url, timeout=30).text
    buckets = histogram_buckets(text, "toolserve_tool_partial_overlap_s")
    return buckets.get(float("inf"), 0.0) - buckets.get(seconds, 0.0)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_a_plan_streamed_by_the_engine_runs_stage_by_stage_while_it_is_written(
    client: OpenAI, model_name: str, cluster: Endpoints, stream: bool
) -> None:
    """With `tool_choice: auto` vLLM streams a call's arguments as the model writes
    them (structured outputs fix the text here), so the plan's run starts at the
    call's name and its stages run while later ones are decoded; its result is
    the whole plan's. A turn the client does not stream is streamed from the
    engine all the same (its tools take partial input)."""
    stages = [
        {"tool": "calculator", "input": "6 * 7"},
        {"tool": "search", "input": "for statement loop"},
        {"tool": "calculator", "input": "2 ** 10 - 24"},
    ]
    written = (
        '<tool_call>\n{"name": "run_plan", "arguments": '
        + json.dumps({"stages": stages})
        + "}\n</tool_call>"
    )
    before = _overlapped_beyond(cluster, 0.1)
    executed = _written_turn(client, model_name, cluster, "run_plan", written, stream=stream)
    call_message, tool_message = executed[:2]
    assert json.loads(call_message["tool_calls"][0]["function"]["arguments"]) == {"stages": stages}
    assert tool_message["content"] == plan_tool.run_plan(stages)

    deadline = time.monotonic() + 60
    while (after := _overlapped_beyond(cluster, 0.1)) <= before and time.monotonic() < deadline:
        time.sleep(1)
    # Decoding the stages takes the model seconds on the CPU; a call delivered
    # whole at the end (a required or named tool choice) overlaps nothing.
    assert after > before, "the plan did not run while the model was writing it"


def test_a_request_may_turn_stopping_off(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    written = '<tool_call>\n{"name": "calculator", "arguments": {"expression": 42}}\n</tool_call>'
    options = {"stop_invalid_calls": False}
    executed = _written_turn(client, model_name, cluster, "calculator", written, options)
    call_message, tool_message = executed[:2]
    assert json.loads(call_message["tool_calls"][0]["function"]["arguments"]) == {"expression": 42}
    assert "stopped while it was written" not in tool_message["content"]


def _weather_turn(
    client: OpenAI, model: str, tool: dict[str, Any], program: str, execute_tools: bool
) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        extra_headers={"X-Session-ID": program},
        extra_body={"toolserve": {"execute_tools": execute_tools}},
    )


def test_a_posted_client_output_answers_the_call_without_a_round_trip(
    client: OpenAI, model_name: str, cluster: Endpoints, weather_tool: dict[str, Any]
) -> None:
    program = f"posted-{uuid.uuid4().hex[:8]}"
    first = _weather_turn(client, model_name, weather_tool, program, execute_tools=True)
    (call,) = first.choices[0].message.tool_calls or []
    assert "toolserve" not in (first.model_extra or {}), "nothing posted yet: the client runs it"
    posted = httpx.post(
        f"{cluster.api_base.removesuffix('/v1')}/cache-tool-output/{first.id}",
        json=[
            {
                "name": call.function.name,
                "params": json.loads(call.function.arguments),
                "output": "Sunny, 21 C",
            }
        ],
        headers={"Authorization": "Bearer test"},
        timeout=30,
    )
    assert posted.status_code == 200, posted.text
    assert posted.json() == {"cached": 1}

    second = _weather_turn(client, model_name, weather_tool, program, execute_tools=True)
    extension = (second.model_extra or {}).get("toolserve")
    assert extension is not None, "the posted output should answer the same call"
    assert extension["executed_messages"][1]["content"] == "Sunny, 21 C"

    other_program = _weather_turn(
        client, model_name, weather_tool, program + "-other", execute_tools=True
    )
    assert "toolserve" not in (other_program.model_extra or {}), "outputs stay in their program"


def test_cache_tool_output_rejects_unknown_foreign_and_malformed_posts(
    client: OpenAI,
    model_name: str,
    cluster: Endpoints,
    weather_tool: dict[str, Any],
    healthy_after: None,
) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    response = client.chat.completions.create(
        model=model_name, messages=messages, tools=[weather_tool], max_tokens=4
    )
    without_tools = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=4
    )
    url = f"{cluster.api_base.removesuffix('/v1')}/cache-tool-output"
    owner = {"Authorization": "Bearer test"}
    entry = [{"name": "f", "params": {"x": 1}, "output": "y"}]

    def post(path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{url}/{path}", content=content, headers=headers, timeout=30)

    cases = [
        (post("chatcmpl-unknown", entry, owner), 404),
        (post(without_tools.id, entry, owner), 404),  # it could make no call
        (post(response.id, entry, {"Authorization": "Bearer someone-else"}), 403),
        (post(response.id, entry, {}), 403),
        (post(response.id, b"{not json", owner), 422),
        (post(response.id, {"name": "f", "output": "y"}, owner), 422),
        (post(response.id, [{"name": "f"}], owner), 422),
        (post(response.id, [{"name": "f", "output": 1, "keep_alive": 0}], owner), 422),
    ]
    for reply, status in cases:
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
    ok = post(response.id, [*entry, {"name": "g", "output": ["a"]}], owner)
    assert ok.status_code == 200 and ok.json() == {"cached": 2}


def test_the_demo_agent_gets_its_calculator_call_answered_by_the_server(
    cluster: Endpoints, model_name: str
) -> None:
    records = run_demo(cluster.api_base, model_name, log=lambda _: None)
    assert len(records) == 5
    calculator_turn = records[2]
    assert [name for name, _ in calculator_turn.server_calls] == ["calculator"]
    assert len(calculator_turn.server_results) == 1
    file_turns = records[:2]
    assert all(r.tool_calls and not r.server_calls for r in file_turns), (
        "the demo's own file tools share hosted names but not schemas: the demo runs them"
    )
    [(name, _, content)] = records[1].tool_calls
    assert name == "read_file" and content in WORKSPACE_FILES.values(), "a real file was read"
    answer = records[-1].answer
    assert answer and answer.strip() and "<" not in answer, "the last turn answers in prose"
    assert all(r.cached_prompt_tokens for r in records[1:]), "returning turns reuse the prefix"


def test_a_reply_allowed_one_call_ends_where_that_call_closes(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    """`parallel_tool_calls: false`: the model (its text fixed by structured
    outputs) would write two calls; decoding ends at the first call's close
    instead of writing the second for vLLM to drop."""
    calls = "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        + "\n</tool_call>"
        for expression in ("1234 * 5678", "98765 - 4321 + 1111 * 2222 - 3333")
    )
    tools = [t for t in _hosted_tools(cluster) if t["function"]["name"] == "calculator"]

    def reply(parallel: bool) -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=QUESTION,
            tools=tools,
            tool_choice="auto",
            parallel_tool_calls=parallel,
            temperature=0,
            max_tokens=160,
            extra_body={
                "structured_outputs": {"choice": [LEAD + calls]},
                "toolserve": {"execute_tools": False},
            },
        )

    one, both = reply(parallel=False), reply(parallel=True)
    assert [call.function.arguments for call in one.choices[0].message.tool_calls or []] == [
        '{"expression": "1234 * 5678"}'
    ]
    assert len(both.choices[0].message.tool_calls or []) == 2
    assert one.choices[0].finish_reason == "tool_calls"
    assert one.usage is not None and both.usage is not None
    assert one.usage.completion_tokens < both.usage.completion_tokens


WRITE_FILE: Any = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file in the client's workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string", "maxLength": 400},
            },
            "required": ["path", "content"],
        },
    },
}


def test_a_client_tools_call_streams_as_it_is_written_with_continuation_on(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    """A long call of a client tool, in a turn that also declares a hosted tool
    (so the server would continue it): the call's arguments arrive in many deltas
    as the model writes them, and add up to the call the non-streamed turn makes."""
    calculator = [t for t in _hosted_tools(cluster) if t["function"]["name"] == "calculator"]

    def turn(stream: bool) -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Save my notes to notes.txt."}],
            tools=[WRITE_FILE, *calculator],
            tool_choice={"type": "function", "function": {"name": "write_file"}},
            temperature=0,
            max_tokens=400,
            stream=stream,
        )

    whole = turn(stream=False)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 1, whole
    (expected,) = calls
    assert "toolserve" not in (whole.model_extra or {}), "the client runs its own tool"

    fragments: list[str] = []
    name, finish = None, None
    for chunk in turn(stream=True):
        assert "toolserve" not in (chunk.model_extra or {})
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.index == 0
            if delta.function and delta.function.name:
                name = delta.function.name
                assert not fragments, "the name comes first"
            if delta.function and delta.function.arguments:
                fragments.append(delta.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert name == "write_file" and finish == whole.choices[0].finish_reason
    print(f"client call: {len(fragments)} argument deltas")
    assert len(fragments) >= 10, fragments
    assert json.loads("".join(fragments)) == json.loads(expected.function.arguments)

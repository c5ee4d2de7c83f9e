"""Prefix integrity through the whole cluster, with the `openai` SDK handing the
assistant's message back as agents do. The model writes its call's arguments over
several lines (a call forced by `tool_choice`, which vLLM holds to the hermes
format); the API returns them compact and the chat template renders them compact,
so the next prompt parts from what the engine holds inside the reply. The replica
says so (header, session, metrics) and puts the model's own tokens back: the
engine serves the whole last turn from its prefix cache. A changed system prompt
is a break the replica names and leaves alone."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_text import metric_total

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e

PREFIX_HEADER = "x-toolserve-prefix"
WEATHER_WITH_NOTE: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city, with a note on what to look for.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "note": {"type": "string", "maxLength": 400},
            },
            "required": ["city", "note"],
        },
    },
}


def _turn(
    client: OpenAI,
    model_name: str,
    messages: list[Any],
    session: str,
    tool: dict[str, Any],
    **extra: Any,
) -> Any:
    options: dict[str, Any] = {"tool_choice": "auto"} | extra
    return client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=messages,
        tools=[tool],  # type: ignore[list-item]
        temperature=0,
        max_tokens=160,
        extra_headers={"X-Session-ID": session},
        **options,
    )


def _prefix_of(client: OpenAI, cluster: Endpoints, session: str) -> Any:
    view = httpx.get(
        f"{cluster.api_base}/sessions/{session}",
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=30,
    )
    assert view.status_code == 200, view.text
    return view.json()["prefix"]


def _breaks(cluster: Endpoints, cause: str, repaired: str) -> float:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return metric_total(text, "toolserve_prefix_breaks_total", cause=cause, repaired=repaired)


def test_a_reply_sent_back_as_the_api_returned_it_keeps_the_engines_prefix(
    client: OpenAI,
    model_name: str,
    cluster: Endpoints,
    cluster_config: ToolserveConfig,
) -> None:
    weather_tool = WEATHER_WITH_NOTE
    session = f"prefix-{uuid.uuid4().hex[:8]}"
    messages: list[Any] = [
        {"role": "system", "content": f"You are weather agent {session}."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    rerendered_before = _breaks(cluster, "assistant_rerendered", "true")

    first = _turn(
        client,
        model_name,
        messages,
        session,
        weather_tool,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert PREFIX_HEADER not in first.headers, "nothing was held for a new program"
    reply = first.parse().choices[0].message
    (call,) = reply.tool_calls or []
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "note"}
    assert call.function.arguments == json.dumps(arguments), "the API re-serializes arguments"

    messages += [
        reply.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    second = _turn(client, model_name, messages, session, weather_tool)
    header = second.headers[PREFIX_HEADER]
    assert header.startswith("repaired; cause=assistant_rerendered; position="), header
    assert header.endswith("; recomputed=0"), header
    prefix = _prefix_of(client, cluster, session)
    assert {key: prefix[key] for key in ("checked_turns", "breaks", "repaired")} == {
        "checked_turns": 1,
        "breaks": 1,
        "repaired": 1,
    }
    last = prefix["last"]
    assert last["cause"] == "assistant_rerendered" and last["repaired"]
    assert last["first_divergent_position"] < last["held_tokens"]
    # The engine served the whole last turn (all but a partial last block) from
    # its prefix cache: the model's own tokens are what it computed.
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    block = cluster_config.main.engine.block_size
    divergent_block = last["first_divergent_position"] // block
    assert (last["held_tokens"] - 1) // block > divergent_block, ("reply too short", last)
    assert cached >= last["held_tokens"] - block, (cached, last)
    assert cached > divergent_block * block, "without the repair the cache ends there"

    changed = [{"role": "system", "content": f"You are weather agent {session}, in Lyon."}]
    streamed = _turn(
        client,
        model_name,
        [*changed, *messages[1:]],
        session,
        weather_tool,
        stream=True,
    )
    header = streamed.headers[PREFIX_HEADER]
    assert header.startswith("broken; cause=system_prompt_changed; position="), header
    assert list(streamed.parse()), "the turn still streams"
    prefix = _prefix_of(client, cluster, session)
    assert prefix["checked_turns"] == 2 and prefix["breaks"] == 2 and prefix["repaired"] == 1
    assert prefix["tokens_recomputed"] > 0

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _breaks(cluster, "assistant_rerendered", "true") > rerendered_before and _breaks(
            cluster, "system_prompt_changed", "false"
        ):
            break
        time.sleep(2)
    assert _breaks(cluster, "assistant_rerendered", "true") > rerendered_before
    assert _breaks(cluster, "system_prompt_changed", "false") >= 1


def test_the_hosted_rounds_a_library_leaves_out_are_put_back(
    client: OpenAI, model_name: str, cluster: Endpoints, cluster_config: ToolserveConfig
) -> None:
    """The server runs a hosted calculator call and the model answers; the client
    keeps only the answer, as openai-agents and langchain-openai do. The next
    turn is repaired: the server's call and result go back before the answer."""
    tools = httpx.get(
        f"{cluster.api_base}/tools",
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=30,
    ).json()["data"]
    calculator = next(tool for tool in tools if tool["function"]["name"] == "calculator")
    session = f"rounds-{uuid.uuid4().hex[:8]}"
    messages: list[Any] = [
        {"role": "system", "content": f"You are shop assistant {session}. Use the calculator."},
        {"role": "user", "content": "What do 3 lamps at 24.50 euros cost?"},
    ]
    first = _turn(
        client,
        model_name,
        messages,
        session,
        calculator,
        tool_choice={"type": "function", "function": {"name": "calculator"}},
    )
    answered = first.parse()
    assert answered.model_extra and answered.model_extra["toolserve"]["executed_messages"]
    reply = answered.choices[0].message
    assert not reply.tool_calls and reply.content, "the server ran the call and continued"

    messages += [
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": "And 4 lamps?"},
    ]
    second = _turn(client, model_name, messages, session, calculator, tool_choice="none")
    header = second.headers[PREFIX_HEADER]
    assert header.startswith("repaired; cause=server_rounds_left_out; position="), header
    last = _prefix_of(client, cluster, session)["last"]
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    block = cluster_config.main.engine.block_size
    assert cached >= last["held_tokens"] - block, (cached, last)
    assert cached > last["first_divergent_position"] // block * block, "the rounds came from cache"

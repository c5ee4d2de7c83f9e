"""Speculative tool calls on the shared cluster: a call the predictors foresee
runs once, early, and the model's own call reuses it. Real Ray, Redis, vLLM
(SmolLM2, main and draft) and the `openai` SDK."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from prometheus_text import metric_total
from written_calls import CALCULATOR_FEW_SHOT

from bench.tools import record_text
from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from toolworkers.client import SpeculativeToolClient, SpeculativeTurn

pytestmark = pytest.mark.e2e

PLAN_THEN_WEATHER_CALL = (
    r"[A-Z][A-Za-z ,']{20,120}\.\n<tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]+"\}\}\n</tool_call>'
)
LOOKUP_CHOICE = {"type": "function", "function": {"name": "lookup_record"}}


def _hosted_tool(cluster: Endpoints, name: str) -> list[dict[str, Any]]:
    listed = httpx.get(f"{cluster.api_base}/tools", timeout=30).json()["data"]
    return [tool for tool in listed if tool["function"]["name"] == name]


def _calculator_turn(
    client: OpenAI,
    model_name: str,
    cluster: Endpoints,
    messages: list[dict[str, Any]],
    session: str,
    **extra: Any,
) -> Any:
    """A greedy turn that may call the hosted calculator (`tool_choice: auto`, so
    the call is hermes text the engine sees)."""
    return client.chat.completions.create(
        model=model_name,
        messages=messages,  # type: ignore[arg-type]
        tools=_hosted_tool(cluster, "calculator"),  # type: ignore[arg-type]
        tool_choice="auto",
        temperature=0,
        max_tokens=64,
        extra_headers={"X-Session-ID": session},
        **extra,
    )


def test_a_correctly_predicted_call_runs_once_and_is_reused(
    client: OpenAI, model_name: str, cluster: Endpoints, lookup_ledger: Path
) -> None:
    tools = _hosted_tool(cluster, "lookup_record")
    agent = [
        {"role": "system", "content": f"You are records agent {uuid.uuid4().hex[:6]}."},
        {"role": "user", "content": "Look up the record INC-2041 and summarize it."},
    ]

    def turn(messages: list[Any], program: str, **extra: Any) -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=messages,
            tools=tools,
            temperature=0,
            max_tokens=48,
            extra_headers={"X-Session-ID": program},
            **extra,
        )

    # Turns whose calls go back to the client teach the learned predictor too.
    probes = [
        turn(
            agent,
            f"probe-{uuid.uuid4().hex[:6]}",
            tool_choice=LOOKUP_CHOICE,
            extra_body={"toolserve": {"execute_tools": False}},
        )
        for _ in range(2)
    ]
    calls = [(probe.choices[0].message.tool_calls or [None])[0] for probe in probes]
    assert calls[0] is not None and calls[1] is not None
    assert calls[0].function.arguments == calls[1].function.arguments
    key = json.loads(calls[0].function.arguments)["key"]

    runs_before = _runs(lookup_ledger).count(key)
    response = turn(agent, f"predicted-{uuid.uuid4().hex[:6]}", tool_choice=LOOKUP_CHOICE)
    executed = ((response.model_extra or {}).get("toolserve") or {}).get("executed_messages")
    assert executed, "the server should have answered the lookup"
    assert executed[1]["content"] == record_text(key)
    assert _runs(lookup_ledger).count(key) == runs_before + 1, "one run, shared"

    deadline = time.monotonic() + 90
    used = saved = 0.0
    while time.monotonic() < deadline and not (used and saved):
        text = httpx.get(cluster.metrics_url, timeout=10).text
        used = metric_total(text, "toolserve_speculations_used_total", source="learned")
        saved = metric_total(
            text, "toolserve_tool_time_saved_s_count", origin="speculation:learned"
        )
        time.sleep(2)
    assert used >= 1, "the learned prediction matched the model's call"
    assert saved >= 1, "the model's call reused the speculative run"
    ledger = _ledger(cluster, client.api_key)
    assert ledger["tools"]["lookup_record"]["used"] >= 1, ledger


def _ledger(cluster: Endpoints, api_key: str) -> Any:
    listed = httpx.get(
        f"{cluster.api_base}/tools", headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ).json()
    return listed["toolserve"]["speculation_ledger"]


def test_a_tool_with_side_effects_runs_only_once_its_call_is_written(
    model_name: str, cluster: Endpoints, close_ledger: Path
) -> None:
    """`close_record` is `lookup_record` declared with side effects: the turns
    that teach the learned predictor its call are the same as in the test above,
    yet the tool runs once, when the model's call is written, never on a guess;
    `GET /v1/tools` says so and the caller's ledger shows no speculation of it."""
    api_key = f"close-{uuid.uuid4().hex[:8]}"  # a tenant of its own: an empty ledger
    client = OpenAI(base_url=cluster.api_base, api_key=api_key, max_retries=0, timeout=180)
    listed = httpx.get(
        f"{cluster.api_base}/tools", headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ).json()
    policies = listed["toolserve"]["speculation_policies"]
    assert policies["lookup_record"]["runs_on_a_guess"], policies["lookup_record"]
    closing = policies["close_record"]
    assert not closing["runs_on_a_guess"] and "side effects" in closing["why"], closing
    tools = [tool for tool in listed["data"] if tool["function"]["name"] == "close_record"]
    agent = [
        {"role": "system", "content": f"You are records agent {uuid.uuid4().hex[:6]}."},
        {"role": "user", "content": "Close the record INC-3001 and say it is done."},
    ]
    choice = {"type": "function", "function": {"name": "close_record"}}

    def turn(program: str, **extra: Any) -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=agent,  # type: ignore[arg-type]
            tools=tools,
            tool_choice=choice,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=48,
            extra_headers={"X-Session-ID": program},
            **extra,
        )

    probes = [
        turn(f"probe-{uuid.uuid4().hex[:6]}", extra_body={"toolserve": {"execute_tools": False}})
        for _ in range(2)
    ]
    calls = [(probe.choices[0].message.tool_calls or [None])[0] for probe in probes]
    assert calls[0] is not None and calls[1] is not None
    assert calls[0].function.arguments == calls[1].function.arguments
    record = json.loads(calls[0].function.arguments)["key"]
    assert _runs(close_ledger).count(record) == 0, "handed back: the client's to run"

    response = turn(f"closing-{uuid.uuid4().hex[:6]}")
    executed = ((response.model_extra or {}).get("toolserve") or {}).get("executed_messages")
    assert executed and executed[1]["content"] == record_text(record)
    assert _runs(close_ledger).count(record) == 1, "one run: the model's call"

    deadline = time.monotonic() + 30
    ledger = _ledger(cluster, api_key)
    while ledger["turns"] < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        ledger = _ledger(cluster, api_key)
    assert ledger["turns"] == 1, ledger  # the probes were handed back: not speculated on
    assert ledger["tools"]["close_record"]["issued"] == 0, ledger


def _runs(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def test_the_client_sdk_runs_a_predicted_tool_once_and_reuses_it(
    model_name: str,
    cluster: Endpoints,
    cluster_config: ToolserveConfig,
    weather_tool: dict[str, Any],
) -> None:
    assert cluster_config.draft is not None
    runs: list[str] = []

    def get_weather(city: str) -> str:
        runs.append(city)
        time.sleep(0.5)
        return f"Sunny in {city}"

    async def scenario() -> tuple[SpeculativeTurn, SpeculativeToolClient]:
        async with AsyncOpenAI(base_url=cluster.api_base, api_key="test", max_retries=0) as api:
            sdk = SpeculativeToolClient(
                api,
                tools={"get_weather": get_weather},
                side_effect_free={"get_weather"},
                draft_model=cluster_config.draft.engine.served_model_name,
            )
            # The main model says its plan before calling (held to that shape, as
            # the benchmark does); the draft is asked for the call alone, so its
            # prediction is ready first although it is the same model.
            turn = await sdk.create(
                model=model_name,
                messages=[
                    {
                        "role": "user",
                        "content": "What is the weather in Paris? Say what you will do, "
                        "then call the tool.",
                    }
                ],
                tools=[weather_tool],
                tool_choice="auto",
                temperature=0,
                max_tokens=96,
                extra_headers={"X-Session-ID": f"sdk-{uuid.uuid4().hex[:6]}"},
                extra_body={"structured_outputs": {"regex": PLAN_THEN_WEATHER_CALL}},
            )
            await asyncio.sleep(1.0)  # let the speculative result's post finish
            return turn, sdk

    turn, sdk = asyncio.run(scenario())
    assert sdk.stats.issued == 1, "the draft (greedy, same weights) predicted the call"
    assert len(runs) == 1, "the predicted call ran once"
    if turn.tool_results:
        (result,) = turn.tool_results
        assert result.speculative and result.output == f"Sunny in {runs[0]}"
        assert sdk.stats.used == 1
    else:
        assert turn.executed_messages[1]["content"] == f"Sunny in {runs[0]}", (
            "the posted speculative output answered the call in the server"
        )
    roles = [message["role"] for message in turn.history_messages()]
    assert roles in (["assistant", "tool"], ["assistant", "tool", "assistant"])


def _predicted_tokens_accepted(cluster: Endpoints) -> float:
    text = httpx.get(cluster.metrics_url, timeout=10).text
    return metric_total(text, "toolserve_predicted_call_accepted_tokens_total", tool="calculator")


def test_a_learned_call_is_drafted_by_the_engine_while_the_model_writes_it(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    """Shown two calculator calls, SmolLM2 writes a third of its own (`tool_choice:
    auto`, so as hermes text the engine sees). Two turns that hand it back teach
    the learned predictor; the next turn carries the prediction to the engine,
    which drafts the call's tokens from it and has them accepted."""

    def turn(execute_tools: bool) -> Any:
        return _calculator_turn(
            client,
            model_name,
            cluster,
            CALCULATOR_FEW_SHOT,
            f"drafted-{uuid.uuid4().hex[:8]}",
            extra_body={"toolserve": {"execute_tools": execute_tools}},
        )

    handed_back = [turn(execute_tools=False).choices[0].message for _ in range(2)]
    calls = [message.tool_calls[0].function for message in handed_back if message.tool_calls]
    assert len(calls) == 2 and calls[0] == calls[1], handed_back

    accepted_before = _predicted_tokens_accepted(cluster)
    turn(execute_tools=True)
    deadline = time.monotonic() + 90
    while _predicted_tokens_accepted(cluster) <= accepted_before:
        assert time.monotonic() < deadline, "no drafts from the predicted call were accepted"
        time.sleep(2)


def _draft_calls_sent(cluster: Endpoints) -> dict[str, float]:
    text = httpx.get(cluster.metrics_url, timeout=10).text
    return {
        outcome: metric_total(text, "toolserve_draft_calls_sent_to_engine_total", outcome=outcome)
        for outcome in ("taken", "too_late", "failed")
    }


def test_the_draft_models_call_is_sent_on_to_the_engine_writing_the_turn(
    client: OpenAI, model_name: str, cluster: Endpoints
) -> None:
    """A new agent and a tool not run yet: nothing learned and nothing to weigh
    against the draft's answer time, so the draft model is asked. Its call
    arrives after the turn was sent and goes on to the engine, into the
    program's running request (the call being written, or the answer after the
    server ran it); the draft's answer is timed for the next turns' choice."""
    agent = [
        {"role": "system", "content": f"You are records agent {uuid.uuid4().hex[:8]}."},
        {"role": "user", "content": "Find the record INC-5127 and summarize it."},
    ]
    before = _draft_calls_sent(cluster)
    client.chat.completions.create(
        model=model_name,
        messages=agent,  # type: ignore[arg-type]
        tools=_hosted_tool(cluster, "find_record"),  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "find_record"}},
        temperature=0,
        max_tokens=48,
        extra_headers={"X-Session-ID": f"draft-sent-{uuid.uuid4().hex[:8]}"},
    )
    deadline = time.monotonic() + 90
    while True:
        after = _draft_calls_sent(cluster)
        sent = {outcome: after[outcome] - before[outcome] for outcome in after}
        if sent["taken"] + sent["too_late"] + sent["failed"] >= 1:
            break
        assert time.monotonic() < deadline, "the draft's call was never sent on"
        time.sleep(2)
    print(f"the draft's calls sent on to the engine, by outcome: {sent}")
    assert sent["failed"] == 0, sent
    listed = httpx.get(f"{cluster.api_base}/tools", timeout=30).json()
    policy = listed["toolserve"]["speculation_policies"]["find_record"]
    assert policy["typical_draft_answer_s"] is not None, policy

"""The ingress's speculator sends the draft model's predictions, which arrive after
the turn was sent, on to the engine writing the turn; learned predictions already
went with the turn, so only calls not issued before are sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from cluster.config import HostedToolConfig, SpeculationConfig, ToolsConfig
from deployments.api.speculator import Speculator, call_text
from deployments.turn import ReplyHead
from toolworkers.predictor import ObservedCall, PredictedCall
from toolworkers.registry import ToolRegistry

REGISTRY = ToolRegistry.from_config(
    ToolsConfig(hosted=[HostedToolConfig(function="toolworkers.hosted_tools:calculator")])
)
DRAFTED_CALL = {"name": "calculator", "arguments": {"expression": "6*7"}}


class _Executor:
    registry = REGISTRY

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, name: str, arguments: dict[str, Any], **_: Any) -> None:
        self.calls.append((name, arguments))


class _DraftStream:
    def __init__(self, body: dict[str, Any]):
        self._head = ReplyHead(replica_id="r", streaming=False, body=body)

    def __aiter__(self) -> _DraftStream:
        return self

    async def __anext__(self) -> ReplyHead:
        return self._head

    def cancel(self) -> None:
        pass


class _Draft:
    """The draft model: answers with one hermes call."""

    def chat(self, request: Any, turn: Any, program_id: str) -> _DraftStream:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": DRAFTED_CALL["name"],
                "arguments": json.dumps(DRAFTED_CALL["arguments"]),
            },
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return _DraftStream({"choices": [{"index": 0, "message": message}]})


def _body() -> dict[str, Any]:
    return {
        "model": "main",
        "messages": [{"role": "user", "content": "What is six times seven?"}],
        "tools": REGISTRY.openai_schemas(),
    }


def _speculator(
    sent: list[tuple[str, list[str]]], executor: _Executor, learned: bool = False
) -> Speculator:
    async def late_predictions(program_id: str, call_texts: list[str]) -> int:
        sent.append((program_id, call_texts))
        return 1

    config = SpeculationConfig(
        draft_predictions=1, learned=learned, draft_when="always", learned_min_support=1
    )
    return Speculator(config, executor, _Draft(), "draft", late_predictions)  # type: ignore[arg-type]


def test_the_draft_models_calls_are_sent_on_to_the_engine() -> None:
    sent: list[tuple[str, list[str]]] = []
    executor = _Executor()

    async def scenario() -> list[str]:
        speculator = _speculator(sent, executor)
        turn = speculator.start(_body(), "program-1", "tenant", launch=True)
        assert turn is not None and turn.task is not None
        await turn.task
        return turn.issued_call_texts()

    issued = asyncio.run(scenario())
    assert executor.calls == [(DRAFTED_CALL["name"], DRAFTED_CALL["arguments"])]
    assert sent == [("program-1", issued)]
    assert json.loads(issued[0]) == DRAFTED_CALL


def test_a_draft_call_the_learned_predictor_issued_is_not_sent_again() -> None:
    """Learned predictions go with the turn: the draft's same call is not new."""
    sent: list[tuple[str, list[str]]] = []
    executor = _Executor()

    async def scenario() -> list[str]:
        speculator = _speculator(sent, executor, learned=True)
        made = [ObservedCall(DRAFTED_CALL["name"], DRAFTED_CALL["arguments"])]
        for _ in range(3):
            taught = speculator.start(_body(), "program-1", "tenant", launch=False)
            assert taught is not None
            speculator.settle(taught, made)
        turn = speculator.start(_body(), "program-1", "tenant", launch=True)
        assert turn is not None and turn.task is not None
        issued_with_the_turn = turn.issued_call_texts()
        await turn.task
        return issued_with_the_turn

    issued_with_the_turn = asyncio.run(scenario())
    assert [json.loads(text) for text in issued_with_the_turn] == [DRAFTED_CALL]
    assert sent == []


def test_one_tenants_calls_never_shape_anothers_predictions() -> None:
    """The same agent (instructions and tools) under two API keys: what tenant B's
    turns teach the learned predictor is B's alone."""
    executor = _Executor()
    made = [ObservedCall(DRAFTED_CALL["name"], DRAFTED_CALL["arguments"])]

    def learned_issue(speculator: Speculator, tenant: str) -> list[str]:
        turn = speculator.start(_body(), "program-1", tenant, launch=True)
        assert turn is not None and turn.task is not None
        turn.task.cancel()  # the draft's answer is not what this test is about
        return turn.issued_call_texts()

    async def scenario() -> tuple[list[str], list[str]]:
        speculator = _speculator([], executor, learned=True)
        for _ in range(3):
            taught = speculator.start(_body(), "program-1", "tenant-b", launch=False)
            assert taught is not None
            speculator.settle(taught, made)
        return learned_issue(speculator, "tenant-a"), learned_issue(speculator, "tenant-b")

    for_a, for_b = asyncio.run(scenario())
    assert for_a == []
    assert [json.loads(text) for text in for_b] == [DRAFTED_CALL]


def test_call_text_is_the_json_object_the_model_writes() -> None:
    call = PredictedCall("calculator", {"expression": "1+1"}, 1.0, "learned")
    assert json.loads(call_text(call)) == {
        "name": "calculator",
        "arguments": {"expression": "1+1"},
    }

"""Partial execution of one streamed round, on a real Redis and a real tool worker
(its `run_partial` called in this process, as Serve would call it): the tool
starts on the pieces of a call the model is still writing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tool_paths import owned_by_tools

from cluster.config import HostedToolConfig, SandboxLimits, ToolsConfig
from cluster.store.partial_calls import ChannelUnavailable, PartialCallChannel
from cluster.store.tool_state import LocalToolStateStore
from deployments.replica.continuation import RoundCalls
from toolworkers.call_stream import ToolCallDeltaParser
from toolworkers.execution import PartialCalls, ToolExecutor
from toolworkers.partial_execution import PartialExecution
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult
from toolworkers.workers import ToolWorker

LIMITS = SandboxLimits(memory_mb=512, cpu_s=30, max_output_bytes=64 * 1024)


class RoundFragments:
    """A round's call fragments read once, as a streamed round reads them, and its
    events given to the round's partial runs."""

    def __init__(self, partial: PartialExecution) -> None:
        self._parser = ToolCallDeltaParser()
        self._calls = RoundCalls(partial, None, set())

    async def feed(self, fragments: list[dict[str, Any]]) -> None:
        await self._calls.feed(self._parser.feed(fragments))

    async def end(self) -> None:
        await self._calls.end(self._parser.finish())


class RecordedRuns:
    """Stands in for the tool metrics: what the executor reports of partial runs."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[tuple[str, str, int]] = []

    def partial_started(self, tool: str) -> None:
        self.started.append(tool)

    def partial_ended(self, tool: str, ending: str, pieces: int) -> None:
        self.ended.append((tool, ending, pieces))


def executor(
    redis_url: str, writable: Path | None = None, observer: RecordedRuns | None = None
) -> ToolExecutor:
    config = ToolsConfig(
        hosted=[
            HostedToolConfig(function="toolworkers.python_tool:python"),
            HostedToolConfig(function="toolworkers.hosted_tools:calculator"),
            HostedToolConfig(function="toolworkers.search_tool:search"),
            HostedToolConfig(function="toolworkers.plan_tool:run_plan"),
        ]
    )
    limits = LIMITS.model_copy(
        update={"allowed_paths": [owned_by_tools(writable)] if writable else []}
    )
    worker = ToolWorker(limits, redis_url)

    async def run_whole(call: SandboxCall) -> ToolResult:
        return await worker.run(call)

    return ToolExecutor(
        ToolRegistry.from_config(config),
        run_whole,
        None,
        config.cache,
        LocalToolStateStore(60),
        None,
        PartialCalls(worker.run_partial, PartialCallChannel(redis_url), observer),
    )


def fragments_of(
    index: int, name: str, arguments: dict[str, Any], size: int
) -> list[dict[str, Any]]:
    text = json.dumps(arguments)
    return [{"index": index, "id": f"call_{index}", "function": {"name": name}}] + [
        {"index": index, "function": {"arguments": text[at : at + size]}}
        for at in range(0, len(text), size)
    ]


async def wait_for(path: Path, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_channel_carries_messages_in_order(redis_url: str) -> None:
    async def scenario() -> list[Any]:
        channel = PartialCallChannel(redis_url)
        call_id = uuid.uuid4().hex
        for message in ({"piece": "a"}, {"piece": 2}, {"finish": {"code": "x"}}):
            await channel.send(call_id, message)
        received = [await channel.receive(call_id, 1.0) for _ in range(3)]
        received.append(await channel.receive(call_id, 0.1))
        await channel.close()
        return received

    assert asyncio.run(scenario()) == [
        {"piece": "a"},
        {"piece": 2},
        {"finish": {"code": "x"}},
        None,
    ]


def test_a_channel_without_redis_says_so() -> None:
    async def scenario() -> None:
        await PartialCallChannel("redis://127.0.0.1:1/0").send("call", {"piece": 1})

    with pytest.raises(ChannelUnavailable):
        asyncio.run(scenario())


def test_the_tool_runs_statements_while_the_call_is_written(redis_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "first-statement-ran"
    code = f"open({str(marker)!r}, 'w').write('x')\nprint(6 * 7)\n"
    fragments = fragments_of(0, "python", {"code": code}, size=7)
    written = [fragment["function"].get("arguments", "") for fragment in fragments]
    # The first fragment after which the first statement is whole and the call is not.
    cut = next(at for at in range(len(fragments)) if "print(6" in "".join(written[: at + 1])) + 1

    async def scenario() -> tuple[bool, bool, str | None]:
        partial = PartialExecution(executor(redis_url, tmp_path), {"python", "calculator"})
        partial_calls = RoundFragments(partial)
        for fragment in fragments[:cut]:
            await partial_calls.feed([fragment])
        ran_before_the_call_closed = await wait_for(marker)
        for fragment in fragments[cut:]:
            await partial_calls.feed([fragment])
        await partial_calls.end()
        outcome = await partial.outcome(0, json.dumps({"code": code}))
        await partial.abandon()
        return (
            ran_before_the_call_closed,
            partial.started == 1,
            None if outcome is None else outcome.result.output,
        )

    assert asyncio.run(scenario()) == (True, True, "42\n")


def test_the_partial_outcome_is_the_whole_calls_and_other_calls_run_as_usual(
    redis_url: str,
) -> None:
    code = "x = 1\nprint(x)\nprint(undefined)\n"

    runs = RecordedRuns()

    async def scenario() -> tuple[Any, ...]:
        tools = executor(redis_url, observer=runs)
        partial = PartialExecution(tools, {"python", "calculator"})
        partial_calls = RoundFragments(partial)
        await partial_calls.feed(fragments_of(0, "python", {"code": code}, size=5))
        await partial_calls.feed(fragments_of(1, "calculator", {"expression": "1+1"}, size=5))
        await partial_calls.end()
        ran = await partial.outcome(0, json.dumps({"code": code}))
        whole = await tools.call("python", {"code": code}, tenant="t", program_id="p")
        not_partial = await partial.outcome(1, json.dumps({"expression": "1+1"}))
        await partial.abandon()
        assert ran is not None
        return (ran.result.ok, ran.result.output, partial.started, not_partial) == (
            whole.result.ok,
            whole.result.output,
            1,
            None,
        ), ran.result.output

    same, output = asyncio.run(scenario())
    assert same
    assert output == "1\nline 3: NameError: name 'undefined' is not defined"
    assert runs.started == ["python"]
    assert runs.ended == [("python", "finished", 3)], "one piece a line"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("search", {"query": "while loop else", "max_results": 2}),
        (
            "run_plan",
            {
                "stages": [
                    {"tool": "calculator", "input": "2 ** 8"},
                    {"tool": "search", "input": "context manager"},
                    {"tool": "calculator", "input": "1 / 0"},
                ]
            },
        ),
    ],
)
def test_search_and_plan_run_partially_in_the_sandbox_give_the_whole_calls_result(
    redis_url: str, tool: str, arguments: dict[str, Any]
) -> None:
    async def scenario() -> tuple[Any, Any, int]:
        tools = executor(redis_url)
        partial = PartialExecution(tools, {tool})
        partial_calls = RoundFragments(partial)
        await partial_calls.feed(fragments_of(0, tool, arguments, size=9))
        await partial_calls.end()
        ran = await partial.outcome(0, json.dumps(arguments))
        whole = await tools.call(tool, arguments, tenant="t", program_id="p")
        await partial.abandon()
        assert ran is not None
        return (
            (ran.result.ok, ran.result.output),
            (whole.result.ok, whole.result.output),
            (partial.started),
        )

    ran, whole, started = asyncio.run(scenario())
    assert started == 1
    assert ran == whole
    assert ran[0] and "1. " in ran[1]


def test_different_final_arguments_or_an_abandoned_round_stop_the_run(
    redis_url: str, tmp_path: Path
) -> None:
    def slow_script(marker: Path) -> str:
        return f"import time\ntime.sleep(1.5)\nopen({str(marker)!r}, 'w').write('x')\n"

    mismatched, abandoned = tmp_path / "mismatched", tmp_path / "abandoned"

    runs = RecordedRuns()

    async def scenario() -> Any:
        partial = PartialExecution(executor(redis_url, observer=runs), {"python"})
        partial_calls = RoundFragments(partial)
        await partial_calls.feed(fragments_of(0, "python", {"code": slow_script(mismatched)}, 6))
        await partial_calls.end()
        mismatch = await partial.outcome(0, json.dumps({"code": "print('other')\n"}))
        unfinished = fragments_of(0, "python", {"code": slow_script(abandoned)}, 6)[:-1]
        second = PartialExecution(executor(redis_url, observer=runs), {"python"})
        second_calls = RoundFragments(second)
        await second_calls.feed(unfinished)
        await asyncio.sleep(0.2)
        await second.abandon()
        await asyncio.sleep(3)
        return mismatch

    assert asyncio.run(scenario()) is None
    assert not mismatched.exists()
    assert not abandoned.exists()
    assert runs.started == ["python", "python"]
    assert [ending for _, ending, _ in runs.ended] == ["abandoned", "abandoned"]


def test_a_call_of_an_undeclared_tool_or_without_partial_input_starts_nothing(
    redis_url: str,
) -> None:
    async def scenario() -> int:
        partial = PartialExecution(executor(redis_url), {"calculator"})
        partial_calls = RoundFragments(partial)
        await partial_calls.feed(fragments_of(0, "python", {"code": "print(1)\n"}, 4))
        await partial_calls.feed(fragments_of(1, "calculator", {"expression": "2"}, 4))
        await partial_calls.end()
        return partial.started

    assert asyncio.run(scenario()) == 0

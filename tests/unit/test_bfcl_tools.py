"""BFCL's multi-turn backends as hosted tools: per-program state kept between
sandboxed calls, in this process's memory and in the real Redis."""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import json
import pickle
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.workloads.bfcl import tool_schemas
from cluster.config import HostedToolConfig, SandboxLimits, ToolsConfig
from cluster.store.tool_cache import ToolCache
from cluster.store.tool_state import LocalToolStateStore, RedisToolStateStore, ToolStateStore
from toolworkers.bfcl_tools import (
    BACKEND_CLASSES,
    READER_FUNCTIONS,
    data_file,
    function_docs,
    new_backend,
    run_backend_function,
    to_json_schema,
)
from toolworkers.execution import ResultSource, ToolExecutor, ToolOutcome
from toolworkers.registry import RegistryError, ToolRegistry, declared_spec, hosted_tool
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed

LIMITS = SandboxLimits(memory_mb=1024, cpu_s=10)
FILE_SYSTEM_SCENARIO = {
    "root": {
        "alice": {
            "type": "directory",
            "contents": {
                "notes.txt": {"type": "file", "content": "remember the milk"},
                "src": {"type": "directory", "contents": {}},
            },
        }
    }
}


def bfcl_config(*classes: str) -> ToolsConfig:
    return ToolsConfig(
        hosted=[HostedToolConfig(function=f"toolworkers.bfcl_tools:{name}") for name in classes]
    )


async def _sandboxed(call: SandboxCall) -> ToolResult:
    return await run_sandboxed(call, LIMITS)


def executor(states: ToolStateStore, *classes: str) -> ToolExecutor:
    config = bfcl_config(*classes)
    return ToolExecutor(ToolRegistry.from_config(config), _sandboxed, None, config.cache, states)


@pytest.fixture()
def state_url(redis_url: str) -> Iterator[str]:
    base, _, _ = redis_url.rpartition("/")
    url = f"{base}/12"
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def program() -> str:
    return f"program-{uuid.uuid4().hex[:8]}"


def test_bfcl_types_become_json_schema() -> None:
    schema = to_json_schema(
        {
            "type": "dict",
            "properties": {
                "amount": {"type": "float", "description": "Money."},
                "tags": {"type": "array", "items": {"type": "string"}},
                "extra": {"type": "dict", "properties": {"n": {"type": "integer"}}},
            },
            "required": ["amount"],
        }
    )
    assert schema == {
        "type": "object",
        "required": ["amount"],
        "properties": {
            "amount": {"type": "number", "description": "Money."},
            "tags": {"type": "array", "items": {"type": "string"}},
            "extra": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }


def test_every_backend_class_is_a_tool_set_of_stateful_tools() -> None:
    registry = ToolRegistry.from_config(bfcl_config(*BACKEND_CLASSES))
    assert registry.state_slots() == sorted(BACKEND_CLASSES)
    assert len(registry.names()) > 100
    speculable = {name for name in registry.names() if registry.speculable(name)}
    assert speculable == set().union(*READER_FUNCTIONS.values())
    file_system = registry.get("ls")
    assert file_system is not None
    assert file_system.spec.state_slot == "GorillaFileSystem"
    assert file_system.function_reference == "toolworkers.bfcl_tools:GorillaFileSystem.ls"
    # The benchmark's BFCL programs declare exactly what the server hosts.
    hosted = {schema["function"]["name"]: schema for schema in registry.openai_schemas()}
    for schema in tool_schemas(["GorillaFileSystem", "TradingBot"], excluded=[]):
        assert hosted[schema["function"]["name"]] == schema


def test_tool_sets_are_configured_whole_and_only_readers_are_side_effect_free() -> None:
    with pytest.raises(RegistryError, match="tool set"):
        ToolRegistry.from_config(
            ToolsConfig(
                hosted=[HostedToolConfig(function="toolworkers.bfcl_tools:MathAPI", name="m")]
            )
        )
    with pytest.raises(RegistryError, match="no 'NoSuchApi'"):
        ToolRegistry.from_config(bfcl_config("NoSuchApi"))
    registry = ToolRegistry.from_config(bfcl_config("GorillaFileSystem"))
    readers = READER_FUNCTIONS["GorillaFileSystem"]
    for name in registry.names():
        tool = registry.get(name)
        assert tool is not None
        assert tool.spec.side_effect_free is tool.spec.reads_state_only is (name in readers)

    @hosted_tool(description="d", parameters={}, side_effect_free=True, state_slot="s")
    def reader(*, state: object) -> str:
        return ""

    assert declared_spec(reader, "tests:reader").reads_state_only


def _ground_truth_calls(category: str) -> Iterator[tuple[dict[str, Any], list[list[str]]]]:
    answers = {
        answer["id"]: answer["ground_truth"]
        for line in data_file(f"possible_answer/BFCL_v4_multi_turn_{category}.json").splitlines()
        if line.strip() and (answer := json.loads(line))
    }
    for line in data_file(f"BFCL_v4_multi_turn_{category}.json").splitlines():
        if line.strip():
            entry = json.loads(line)
            yield entry, answers[entry["id"]]


def _keyword_arguments(function: Any, call: ast.Call) -> dict[str, Any]:
    positional = list(inspect.signature(function).parameters)
    arguments = {positional[i]: ast.literal_eval(value) for i, value in enumerate(call.args)}
    named = {item.arg: ast.literal_eval(item.value) for item in call.keywords if item.arg}
    return arguments | named


@pytest.mark.parametrize("category", ["base", "long_context", "miss_param", "miss_func"])
def test_declared_readers_change_nothing_in_bfcl_ground_truth(category: str) -> None:
    """Every ground-truth call of a declared reader, replayed in order with the
    other calls: the backend pickles the same after it, and a copy of the backend
    gives the same result (so a result cached for a state is the state's result)."""
    documented = {c: {doc["name"] for doc in function_docs(c)} for c in BACKEND_CLASSES}
    assert all(READER_FUNCTIONS[c] <= documented[c] for c in BACKEND_CLASSES)
    reader_calls = 0
    for entry, turns in _ground_truth_calls(category):
        backends: dict[str, tuple[str, Any]] = {}
        for class_name in entry["involved_classes"]:
            backend = new_backend(class_name, entry["initial_config"].get(class_name))
            backends |= {name: (class_name, backend) for name in documented[class_name]}
        for text in (text for turn in turns for text in turn):
            call = ast.parse(text, mode="eval").body
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            class_name, backend = backends[call.func.id]
            arguments = _keyword_arguments(getattr(backend, call.func.id), call)
            if call.func.id not in READER_FUNCTIONS[class_name]:
                run_backend_function(backend, call.func.id, arguments)
                continue
            before, twin = pickle.dumps(backend), copy.deepcopy(backend)
            result = run_backend_function(backend, call.func.id, arguments)
            assert pickle.dumps(backend) == before, f"{entry['id']}: {text} changed the state"
            assert run_backend_function(twin, call.func.id, arguments) == result, text
            reader_calls += 1
    assert reader_calls > 50


async def _file_system_session(states: ToolStateStore) -> None:
    tools = executor(states, "GorillaFileSystem")
    first, second = program(), program()
    await states.set_scenario("t", first, "GorillaFileSystem", FILE_SYSTEM_SCENARIO)

    async def call(program_id: str, name: str, arguments: dict[str, object]) -> ToolResult:
        outcome = await tools.call(name, arguments, tenant="t", program_id=program_id)
        return outcome.result

    listed = await call(first, "ls", {})
    assert listed.ok, listed.output
    assert json.loads(listed.output) == {"current_directory_content": ["notes.txt", "src"]}
    assert (await call(first, "mkdir", {"dir_name": "docs"})).ok
    assert (await call(first, "cd", {"folder": "src"})).ok
    assert (await call(first, "touch", {"file_name": "main.py"})).ok
    assert json.loads((await call(first, "ls", {})).output)["current_directory_content"] == [
        "main.py"
    ]
    # Arguments that do not fit leave the state as it was.
    failed = await call(first, "cd", {"directory": "docs"})
    assert not failed.ok and "bad arguments" in failed.output
    assert json.loads((await call(first, "pwd", {})).output) == {
        "current_working_directory": "/alice/src"
    }
    # Another program (no scenario set): BFCL's empty default file system.
    assert json.loads((await call(second, "ls", {})).output) == {"current_directory_content": []}
    # Setting the scenario again starts the program over.
    await states.set_scenario("t", first, "GorillaFileSystem", FILE_SYSTEM_SCENARIO)
    assert json.loads((await call(first, "ls", {})).output)["current_directory_content"] == [
        "notes.txt",
        "src",
    ]
    # A program's state is its own tenant's.
    assert json.loads((await call(first, "ls", {})).output) != json.loads(
        (await tools.call("ls", {}, tenant="other", program_id=first)).result.output
    )


def test_a_program_keeps_its_file_system_between_sandboxed_calls_in_memory() -> None:
    asyncio.run(_file_system_session(LocalToolStateStore(60)))


def test_a_program_keeps_its_file_system_between_sandboxed_calls_in_redis(state_url: str) -> None:
    async def scenario() -> None:
        states = RedisToolStateStore(state_url, 60)
        await _file_system_session(states)
        await states.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_concurrent_calls_of_a_program_run_one_at_a_time(where: str, state_url: str) -> None:
    async def scenario() -> list[str]:
        # Two executors (two processes of the cluster, or two users of one process's store).
        shared = LocalToolStateStore(60)
        stores: list[ToolStateStore] = (
            [shared, shared]
            if where == "memory"
            else [RedisToolStateStore(state_url, 60) for _ in range(2)]
        )
        executors = [executor(states, "GorillaFileSystem") for states in stores]
        program_id = program()
        names = [f"file{index}.txt" for index in range(6)]
        results = await asyncio.gather(
            *(
                executors[index % 2].call(
                    "touch", {"file_name": name}, tenant="t", program_id=program_id
                )
                for index, name in enumerate(names)
            )
        )
        assert all(outcome.result.ok for outcome in results)
        listed = await executors[0].call("ls", {}, tenant="t", program_id=program_id)
        await stores[0].clear("t", program_id)
        after_clear = await executors[1].call("ls", {}, tenant="t", program_id=program_id)
        assert json.loads(after_clear.result.output) == {"current_directory_content": []}
        for states in stores:
            if isinstance(states, RedisToolStateStore):
                await states.close()
        return list(json.loads(listed.result.output)["current_directory_content"])

    assert sorted(asyncio.run(scenario())) == [f"file{index}.txt" for index in range(6)]


def test_state_store_down_fails_the_call_cleanly() -> None:
    async def scenario() -> ToolResult:
        states = RedisToolStateStore("redis://127.0.0.1:1/0", 60)
        outcome = await executor(states, "MathAPI").call(
            "mean", {"numbers": [1, 2]}, tenant="t", program_id=program()
        )
        await states.close()
        return outcome.result

    result = asyncio.run(scenario())
    assert not result.ok
    assert result.error_kind == "state_unavailable"
    assert "unavailable" in result.output


def test_a_readers_result_is_shared_while_its_programs_state_is_unchanged(state_url: str) -> None:
    async def scenario() -> None:
        states = RedisToolStateStore(state_url, 60)
        cache = ToolCache(state_url, 1000)
        config = bfcl_config("GorillaFileSystem")
        registry = ToolRegistry.from_config(config)
        tools = ToolExecutor(registry, _sandboxed, cache, config.cache, states)
        first, second = program(), program()
        for program_id in (first, second):
            await states.set_scenario("t", program_id, "GorillaFileSystem", FILE_SYSTEM_SCENARIO)

        async def call(name: str, program_id: str = first, origin: str = "") -> ToolOutcome:
            arguments = {"file_name": "new.txt"} if name == "touch" else {}
            return await tools.call(
                name, arguments, tenant="t", program_id=program_id, origin=origin
            )

        speculated = await call("ls", origin="speculation:learned")
        assert speculated.source is ResultSource.RAN and speculated.result.ok
        used = await call("ls")
        assert used.source is ResultSource.CACHED and used.origin == "speculation:learned"
        assert used.result.output == speculated.result.output
        # A reader leaves nothing behind: the slot still holds only its scenario.
        assert (await states.load("t", first, "GorillaFileSystem")).value is None
        # Another program with the same contents: results are its own.
        assert (await call("ls", second)).source is ResultSource.RAN
        # A call that changes the state makes the next read run on the new state.
        assert (await call("touch")).result.ok
        after = await call("ls")
        assert after.source is ResultSource.RAN
        assert "new.txt" in json.loads(after.result.output)["current_directory_content"]
        assert (await call("ls")).source is ResultSource.CACHED
        await cache.close()
        await states.close()

    asyncio.run(scenario())

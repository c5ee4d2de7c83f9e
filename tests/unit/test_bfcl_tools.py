"""BFCL's multi-turn backends as hosted tools: per-program state kept between
sandboxed calls, in this process's memory and in the real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from bench.workloads.bfcl import tool_schemas
from cluster.config import HostedToolConfig, SandboxLimits, ToolsConfig
from cluster.store.tool_state import LocalToolStateStore, RedisToolStateStore, ToolStateStore
from toolworkers.bfcl_tools import BACKEND_CLASSES, to_json_schema
from toolworkers.execution import ToolExecutor
from toolworkers.registry import RegistryError, ToolRegistry, hosted_tool
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
    assert not any(registry.speculable(name) for name in registry.names())
    file_system = registry.get("ls")
    assert file_system is not None
    assert file_system.spec.state_slot == "GorillaFileSystem"
    assert file_system.function_reference == "toolworkers.bfcl_tools:GorillaFileSystem.ls"
    # The benchmark's BFCL programs declare exactly what the server hosts.
    hosted = {schema["function"]["name"]: schema for schema in registry.openai_schemas()}
    for schema in tool_schemas(["GorillaFileSystem", "TradingBot"], excluded=[]):
        assert hosted[schema["function"]["name"]] == schema


def test_tool_sets_are_configured_whole_and_state_means_side_effects() -> None:
    with pytest.raises(RegistryError, match="tool set"):
        ToolRegistry.from_config(
            ToolsConfig(
                hosted=[HostedToolConfig(function="toolworkers.bfcl_tools:MathAPI", name="m")]
            )
        )
    with pytest.raises(RegistryError, match="side-effect-free"):
        ToolRegistry.from_config(
            ToolsConfig(
                hosted=[
                    HostedToolConfig(
                        function="toolworkers.bfcl_tools:MathAPI", side_effect_free=True
                    )
                ]
            )
        )
    with pytest.raises(RegistryError, match="side-effect-free"):
        hosted_tool(description="d", parameters={}, side_effect_free=True, state_slot="s")(len)
    with pytest.raises(RegistryError, match="no 'NoSuchApi'"):
        ToolRegistry.from_config(bfcl_config("NoSuchApi"))


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

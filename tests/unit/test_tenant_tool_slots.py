"""Hosted calls at once per tenant: past the limit a call waits its turn and a
speculative call is not made; another tenant's calls are not held up."""

from __future__ import annotations

import asyncio

from cluster.config import HostedToolConfig, ToolCacheConfig, ToolsConfig
from cluster.store.tool_state import LocalToolStateStore
from toolworkers.execution import SPECULATION_ORIGIN_PREFIX, TenantSlots, ToolExecutor
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult

CONFIG = ToolsConfig(hosted=[HostedToolConfig(function="toolworkers.hosted_tools:calculator")])


def test_a_tenant_runs_at_most_its_calls_at_once() -> None:
    running: list[str] = []
    release = asyncio.Event()

    async def held_run(call: SandboxCall) -> ToolResult:
        running.append(call.arguments["expression"])
        await release.wait()
        return ToolResult(True, "ok", None, 0.0)

    async def scenario() -> tuple[list[str], str | None, list[str]]:
        executor = ToolExecutor(
            ToolRegistry.from_config(CONFIG),
            held_run,
            None,
            ToolCacheConfig(),
            LocalToolStateStore(60),
            tenant_slots=TenantSlots(1),
        )

        def call(expression: str, tenant: str, origin: str = "") -> asyncio.Task[object]:
            return asyncio.create_task(
                executor.call(
                    "calculator",
                    {"expression": expression},
                    tenant=tenant,
                    program_id="p",
                    origin=origin,
                )
            )

        first, second = call("1", "a"), call("2", "a")
        other = call("3", "b")
        await asyncio.sleep(0.05)
        while_full = list(running)
        speculation = await executor.call(
            "calculator",
            {"expression": "4"},
            tenant="a",
            program_id="p",
            origin=SPECULATION_ORIGIN_PREFIX + "draft",
        )
        release.set()
        await asyncio.gather(first, second, other)
        return while_full, speculation.result.error_kind, running

    while_full, speculation_kind, ran = asyncio.run(scenario())
    assert sorted(while_full) == ["1", "3"]  # a's second call waits; b's does not
    assert speculation_kind == "quota"
    assert sorted(ran) == ["1", "2", "3"]

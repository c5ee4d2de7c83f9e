"""The tool-worker pool: a Serve deployment whose replicas (Ray actors, no CPU
reserved) run hosted tool calls, each in its own sandboxed subprocess. Serve
restarts a dead worker and spreads calls over the live ones."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cluster.config import SandboxLimits, ToolsConfig
from cluster.store.tool_cache import ToolCache
from cluster.store.tool_state import LocalToolStateStore, RedisToolStateStore, ToolStateStore
from toolworkers.execution import RunCall, ToolExecutor
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("toolserve.toolworkers")


class ToolWorker:
    """One tool-worker replica. A tool that crashes, hangs or floods its output
    takes down only its own subprocess; the worker answers with a `ToolResult`."""

    def __init__(self, limits: SandboxLimits):
        self._limits = limits

    async def run(self, call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, self._limits)


def worker_pool_runner(workers: DeploymentHandle) -> RunCall:
    """Runs calls on the pool. A worker lost mid-call becomes an error result, not
    a retry: the call may have had side effects."""
    from ray.exceptions import RayError

    async def run(call: SandboxCall) -> ToolResult:
        try:
            result: ToolResult = await workers.run.remote(call)
        except RayError as error:
            logger.warning("tool worker lost during %s: %s", call.function_reference, error)
            return ToolResult(
                False,
                f"the tool worker running this call was lost ({type(error).__name__})",
                "worker_lost",
                0.0,
            )
        return result

    return run


async def _no_workers(call: SandboxCall) -> ToolResult:
    return ToolResult(False, f"no tool workers run {call.function_reference}", "unknown_tool", 0.0)


def tool_executor(
    config: ToolsConfig, redis_url: str | None, workers: DeploymentHandle | None
) -> ToolExecutor:
    """The executor a deployment (a Ray actor) uses: hosted tools from `config`, run
    on the pool, shared through the global tool cache and stateful tools' state
    kept in Redis when there is one, observed by the tool metrics."""
    from toolworkers.metrics import ToolMetrics

    cache = ToolCache(redis_url, config.cache.max_entries) if redis_url else None
    states: ToolStateStore = (
        RedisToolStateStore(redis_url, config.state_ttl_s)
        if redis_url
        else LocalToolStateStore(config.state_ttl_s)
    )
    return ToolExecutor(
        ToolRegistry.from_config(config),
        worker_pool_runner(workers) if workers is not None else _no_workers,
        cache,
        config.cache,
        states,
        ToolMetrics().observe,
    )

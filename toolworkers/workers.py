"""The tool-worker pool: a Serve deployment whose replicas (Ray actors, no CPU
reserved) run hosted tool calls, each in its own sandboxed subprocess. Serve
restarts a dead worker and spreads calls over the live ones."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from cluster.config import SandboxLimits, ToolsConfig
from cluster.store.partial_calls import ChannelUnavailable, PartialCallChannel
from cluster.store.tool_cache import ToolCache
from cluster.store.tool_state import LocalToolStateStore, RedisToolStateStore, ToolStateStore
from toolworkers.execution import (
    PartialCalls,
    RunCall,
    RunPartialCall,
    TenantSlots,
    ToolExecutor,
)
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import PartialCall, SandboxCall, ToolResult, run_sandboxed

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("toolserve.toolworkers")

# A partial call's worker polls its pieces this often, and gives the call up when
# none has come for the longest a model takes to write the next one.
_PIECE_POLL_S = 1.0
_PIECE_SILENCE_S = 120.0
WORKER_ANSWER_GRACE_S = 30.0
"""Beyond a tool's own time limit: the time a call may wait for a busy worker,
and a worker's start-up of the sandboxed process."""


class ToolWorker:
    """One tool-worker replica. A tool that crashes, hangs or floods its output
    takes down only its own subprocess; the worker answers with a `ToolResult`."""

    def __init__(self, limits: SandboxLimits, redis_url: str | None = None):
        self._limits = limits
        self._channel = PartialCallChannel(redis_url, _PIECE_POLL_S) if redis_url else None

    async def run(self, call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, self._limits)

    async def run_partial(self, call: SandboxCall, call_id: str) -> ToolResult:
        """Runs a partial-input call as its pieces come through its channel
        (`cluster.store.partial_calls`), until its `finish` or `abandon`."""
        started = time.monotonic()

        def failed(output: str, error_kind: str) -> ToolResult:
            return ToolResult(False, output, error_kind, time.monotonic() - started)

        if self._channel is None:
            return failed("partial calls need Redis", "unavailable")
        running = PartialCall(call, self._limits)
        try:
            await running.start()
            heard = time.monotonic()
            while True:
                message = await self._channel.receive(call_id, _PIECE_POLL_S)
                if message is None:
                    if time.monotonic() - heard > _PIECE_SILENCE_S:
                        return failed("the call's arguments stopped coming", "abandoned")
                    continue
                heard = time.monotonic()
                if "piece" in message:
                    running.feed(message["piece"])
                elif "finish" in message:
                    return await running.finish(message["finish"])
                else:
                    return failed(f"abandoned: {message.get('abandon')}", "abandoned")
        except ChannelUnavailable as error:
            return failed(f"the call's pieces could not be read: {error}", "unavailable")
        finally:
            running.abandon()


def worker_pool_runner(workers: DeploymentHandle) -> tuple[RunCall, RunPartialCall]:
    """Runs calls, whole and partial, on the pool. A worker lost mid-call becomes
    an error result, not a retry: the call may have had side effects. So does a
    whole call the worker has not answered `WORKER_ANSWER_GRACE_S` after its
    tool's time limit (a hung worker; Serve's health check replaces it later)."""
    from ray.exceptions import RayError

    async def answered(
        call: SandboxCall, response: Awaitable[ToolResult], deadline_s: float | None
    ) -> ToolResult:
        try:
            return await asyncio.wait_for(response, deadline_s)
        except RayError as error:
            logger.warning("tool worker lost during %s: %s", call.function_reference, error)
            return ToolResult(
                False,
                f"the tool worker running this call was lost ({type(error).__name__})",
                "worker_lost",
                0.0,
            )
        except TimeoutError:
            logger.warning("tool worker silent during %s", call.function_reference)
            return ToolResult(
                False,
                f"the tool worker did not answer within {deadline_s:.0f}s",
                "worker_unresponsive",
                deadline_s or 0.0,
            )

    async def run(call: SandboxCall) -> ToolResult:
        deadline_s = call.timeout_s + WORKER_ANSWER_GRACE_S
        return await answered(call, workers.run.remote(call), deadline_s)

    async def run_partial(call: SandboxCall, call_id: str) -> ToolResult:
        # Runs as long as the model takes to write the arguments: no deadline.
        return await answered(call, workers.run_partial.remote(call, call_id), None)

    return run, run_partial


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
    metrics = ToolMetrics()
    run: RunCall = _no_workers
    partial = None
    if workers is not None:
        run, run_partial = worker_pool_runner(workers)
        if redis_url and config.continuation.partial_execution:
            partial = PartialCalls(run_partial, PartialCallChannel(redis_url), metrics)
    return ToolExecutor(
        ToolRegistry.from_config(config),
        run,
        cache,
        config.cache,
        states,
        metrics.observe,
        partial,
        TenantSlots(config.max_calls_per_tenant) if config.max_calls_per_tenant else None,
    )

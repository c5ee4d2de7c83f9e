"""Hosted tool calls, each run at most once per canonical call across the cluster:
a cached result is reused, a call another process is running is awaited, and
otherwise the call runs on the tool workers and its result is cached for the
tool's keep-alive. Only side-effect-free tools are cached; the others just run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cluster.config import ToolCacheConfig
from cluster.store import CachedToolResult, ToolCache
from toolworkers.cache_keys import ArgumentsError, CacheScope, ToolCallKey, normalized_arguments
from toolworkers.registry import HostedTool, ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult

RunCall = Callable[[SandboxCall], Awaitable[ToolResult]]

# A failed call is shared with those already waiting for it, then retried by the
# next requester rather than served from the cache for the tool's whole keep-alive.
_ERROR_KEEP_ALIVE_S = 2.0


class ResultSource(StrEnum):
    RAN = "ran"
    CACHED = "cached"
    AWAITED = "awaited"
    UNCACHED = "uncached"


@dataclass(frozen=True)
class ToolOutcome:
    result: ToolResult
    source: ResultSource


def _from_cache(entry: CachedToolResult) -> ToolResult:
    return ToolResult(entry.state == "done", entry.output, entry.error_kind, 0.0)


def _to_cache(result: ToolResult) -> CachedToolResult:
    return CachedToolResult("done" if result.ok else "error", result.output, result.error_kind)


class ToolExecutor:
    def __init__(
        self,
        registry: ToolRegistry,
        run_call: RunCall,
        cache: ToolCache | None,
        cache_config: ToolCacheConfig,
    ):
        self._registry = registry
        self._run_call = run_call
        self._cache = cache
        self._cache_config = cache_config

    def cache_key(
        self, tool: HostedTool, arguments: dict[str, Any], tenant: str, program_id: str
    ) -> str:
        scope = CacheScope(tenant, program_id if tool.spec.program_scoped else None)
        return str(ToolCallKey.of(scope, tool.spec.name, arguments))

    async def call(
        self,
        name: str,
        arguments: str | dict[str, Any] | None,
        *,
        tenant: str,
        program_id: str,
    ) -> ToolOutcome:
        tool = self._registry.get(name)
        if tool is None:
            known = ", ".join(self._registry.names())
            return ToolOutcome(
                ToolResult(False, f"unknown tool {name!r}; hosted: {known}", "unknown_tool", 0.0),
                ResultSource.UNCACHED,
            )
        try:
            parsed = normalized_arguments(arguments)
        except ArgumentsError as error:
            return ToolOutcome(
                ToolResult(False, str(error), "bad_arguments", 0.0), ResultSource.UNCACHED
            )
        call = SandboxCall(tool.function_reference, parsed, tool.options, tool.spec.timeout_s)
        if self._cache is None or not tool.spec.side_effect_free:
            return ToolOutcome(await self._run_call(call), ResultSource.UNCACHED)
        return await self._single_flight(
            self._cache, self.cache_key(tool, parsed, tenant, program_id), tool, call
        )

    async def _single_flight(
        self, cache: ToolCache, key: str, tool: HostedTool, call: SandboxCall
    ) -> ToolOutcome:
        lease_s = tool.spec.timeout_s + self._cache_config.pending_lease_s
        while True:
            claim = await cache.claim(key, lease_s)
            if claim.claimed:
                result = await self._run_call(call)
                keep_alive = tool.keep_alive_s if result.ok else _ERROR_KEEP_ALIVE_S
                await cache.complete(key, claim.token, _to_cache(result), keep_alive)
                return ToolOutcome(result, ResultSource.RAN)
            assert claim.existing is not None
            if claim.existing.state != "pending":
                return ToolOutcome(_from_cache(claim.existing), ResultSource.CACHED)
            finished = await cache.wait(key, lease_s)
            if finished is not None:
                return ToolOutcome(_from_cache(finished), ResultSource.AWAITED)
            # The runner's lease ran out (it died): claim the call again.

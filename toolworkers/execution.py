"""Hosted tool calls, each run at most once per canonical call across the cluster:
a cached result is reused, a call another process is running is awaited, and
otherwise the call runs on the tool workers and its result is cached for the
tool's keep-alive. Only side-effect-free tools are cached; the others just run,
stateful ones one at a time per program, with their program's state slot. A
stateful tool that only reads its slot is cached per version of the slot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from cluster.config import ToolCacheConfig
from cluster.store.partial_calls import ChannelUnavailable, PartialCallChannel
from cluster.store.tool_cache import CachedToolResult, ToolCache
from cluster.store.tool_state import ToolStateStore, ToolStateUnavailable
from toolworkers.cache_keys import ArgumentsError, CacheScope, ToolCallKey, normalized_arguments
from toolworkers.call_stream import CallEvent
from toolworkers.partial_input import PieceSplitter
from toolworkers.registry import HostedTool, ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult

logger = logging.getLogger("toolserve.toolworkers")

RunCall = Callable[[SandboxCall], Awaitable[ToolResult]]
RunPartialCall = Callable[[SandboxCall, str], Coroutine[Any, Any, ToolResult]]
"""Runs a partial-input call whose pieces come through its channel under the id."""
PARTIAL_ORIGIN = "partial"
SPECULATION_ORIGIN_PREFIX = "speculation:"

# A failed call is shared with those already waiting for it, then retried by the
# next requester rather than served from the cache for the tool's whole keep-alive.
_ERROR_KEEP_ALIVE_S = 2.0
# Beyond the call's own timeout: a program's state lock outlives a call this long.
_STATE_LEASE_MARGIN_S = 5.0


def _state_unavailable(error: ToolStateUnavailable) -> ToolResult:
    return ToolResult(False, f"the tool's state is unavailable: {error}", "state_unavailable", 0.0)


class ResultSource(StrEnum):
    RAN = "ran"
    CACHED = "cached"
    AWAITED = "awaited"
    UNCACHED = "uncached"


CLIENT_ORIGIN = "client"


@dataclass(frozen=True)
class ToolOutcome:
    """A call's result and how this requester got it. `origin`: who ran it ("" for
    a plain call, e.g. `speculation:draft`, or `client` for a posted output);
    `result.duration_s` is the run's own duration, `waited_s` this requester's wait."""

    result: ToolResult
    source: ResultSource
    origin: str = ""
    waited_s: float = 0.0


# (tool name, outcome, origin of the request): every call an executor answers.
ToolObserver = Callable[[str, ToolOutcome, str], None]


def _from_cache(entry: CachedToolResult) -> ToolResult:
    return ToolResult(entry.state == "done", entry.output, entry.error_kind, entry.duration_s)


def _to_cache(result: ToolResult, origin: str) -> CachedToolResult:
    return CachedToolResult(
        "done" if result.ok else "error",
        result.output,
        result.error_kind,
        origin,
        result.duration_s,
    )


class PartialRunObserver(Protocol):
    """What becomes of partial runs: each started, and how it ended (`finished`:
    its outcome was produced; `broken`: its pieces could not be sent and the call
    runs whole; `abandoned`: stopped, nobody takes its outcome) after how many
    pieces."""

    def partial_started(self, tool: str) -> None: ...

    def partial_ended(self, tool: str, ending: str, pieces: int) -> None: ...


@dataclass(frozen=True)
class PartialCalls:
    """How an executor runs calls on partial input: on the pool, fed through Redis."""

    run: RunPartialCall
    channel: PartialCallChannel
    observer: PartialRunObserver | None = None


@dataclass
class PartialRun:
    """A call of a partial-input tool running on a tool worker while the model
    writes it: `feed` it the call's stream events, then `finish` or `abandon` it.
    A run whose pieces could not be sent is `broken`: the call then runs whole."""

    name: str
    call_id: str
    splitter: PieceSplitter
    channel: PartialCallChannel
    result: asyncio.Task[ToolResult]
    observer: PartialRunObserver | None = None
    broken: bool = False
    pieces_sent: int = 0
    ended: bool = False

    async def feed(self, event: CallEvent) -> None:
        for piece in self.splitter.pieces(event):
            await self._send({"piece": piece})
            if not self.broken:
                self.pieces_sent += 1

    async def finish(self, arguments: dict[str, Any]) -> ToolResult | None:
        """The call's result given its whole arguments; None when the run broke."""
        await self._send({"finish": arguments})
        try:
            result = None if self.broken else await self.result
        except asyncio.CancelledError:
            if self.broken:
                self._ended("broken")
                return None
            raise
        self._ended("broken" if result is None else "finished")
        return result

    async def abandon(self, reason: str) -> None:
        await self._send({"abandon": reason})
        self.result.cancel()
        self._ended("abandoned")

    def _ended(self, ending: str) -> None:
        if self.ended:
            return
        self.ended = True
        if self.observer is not None:
            self.observer.partial_ended(self.name, ending, self.pieces_sent)

    async def _send(self, message: dict[str, Any]) -> None:
        if self.broken:
            return
        try:
            await self.channel.send(self.call_id, message)
        except ChannelUnavailable as error:
            logger.warning("partial call of %s lost its channel: %s", self.name, error)
            self.broken = True
            self.result.cancel()


class TenantSlots:
    """At most `limit` calls of one tenant run at once; more wait their turn."""

    def __init__(self, limit: int):
        self._limit = limit
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self._holders: dict[str, int] = {}

    def full(self, tenant: str) -> bool:
        return self._holders.get(tenant, 0) >= self._limit

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        semaphore = self._semaphores.setdefault(tenant, asyncio.Semaphore(self._limit))
        self._holders[tenant] = self._holders.get(tenant, 0) + 1
        try:
            async with semaphore:
                yield
        finally:
            self._holders[tenant] -= 1
            if not self._holders[tenant]:
                del self._holders[tenant], self._semaphores[tenant]


class ToolExecutor:
    def __init__(
        self,
        registry: ToolRegistry,
        run_call: RunCall,
        cache: ToolCache | None,
        cache_config: ToolCacheConfig,
        states: ToolStateStore,
        observe: ToolObserver | None = None,
        partial: PartialCalls | None = None,
        tenant_slots: TenantSlots | None = None,
    ):
        self._registry = registry
        self._tenant_slots = tenant_slots
        self._run_call = run_call
        self._cache = cache
        self._cache_config = cache_config
        self._states = states
        self._observe = observe
        self._partial = partial

    def cache_key(self, name: str, arguments: dict[str, Any], tenant: str, program_id: str) -> str:
        """A hosted tool's results are shared per its scope; a client tool's only
        within the program (they may depend on the client's state)."""
        tool = self._registry.get(name)
        program_scoped = tool is None or tool.spec.program_scoped
        scope = CacheScope(tenant, program_id if program_scoped else None)
        return str(ToolCallKey.of(scope, name, arguments))

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def states(self) -> ToolStateStore:
        return self._states

    async def post_client_result(
        self,
        name: str,
        arguments: str | dict[str, Any] | None,
        output: str,
        keep_alive_s: float | None,
        *,
        tenant: str,
        program_id: str,
    ) -> bool:
        """Caches the output of a call the client ran itself (it replaces whatever
        the cache held for that call). Raises ArgumentsError for bad arguments."""
        key = self.cache_key(name, normalized_arguments(arguments), tenant, program_id)
        if self._cache is None:
            return False
        keep_alive = min(
            keep_alive_s or self._cache_config.keep_alive_s,
            self._cache_config.max_posted_keep_alive_s,
        )
        posted = CachedToolResult("done", output, None, CLIENT_ORIGIN)
        return await self._cache.complete(key, "", posted, keep_alive)

    async def resolve(
        self,
        name: str,
        arguments: str | dict[str, Any] | None,
        *,
        tenant: str,
        program_id: str,
        client_result_wait_s: float,
        hosted: bool,
    ) -> ToolOutcome | None:
        """The result of a call the model just made, if the server can give it: a
        `hosted` tool runs (or its cached or in-flight result is used); a client
        tool's result is used only when the client posted it (waiting up to
        `client_result_wait_s` for it). None: the call must go to the client."""
        if hosted:
            return await self.call(name, arguments, tenant=tenant, program_id=program_id)
        if self._cache is None:
            return None
        try:
            parsed = normalized_arguments(arguments)
        except ArgumentsError:
            return None
        key = self.cache_key(name, parsed, tenant, program_id)
        entry = await self._cache.wait(key, client_result_wait_s, absent_is_final=False)
        if entry is None or entry.state != "done":
            return None
        return ToolOutcome(_from_cache(entry), ResultSource.CACHED, entry.origin)

    async def call(
        self,
        name: str,
        arguments: str | dict[str, Any] | None,
        *,
        tenant: str,
        program_id: str,
        origin: str = "",
    ) -> ToolOutcome:
        """Runs a hosted call, or reuses its cached or in-flight result. `origin`
        marks who asked (a speculation) for whoever later reuses the result. Past
        the tenant's calls at once, a call waits for one to end; a speculation is
        not made."""
        started = time.monotonic()
        slots = self._tenant_slots
        if slots is None:
            outcome = await self._call(name, arguments, tenant, program_id, origin)
        elif origin.startswith(SPECULATION_ORIGIN_PREFIX) and slots.full(tenant):
            skipped = ToolResult(False, "the tenant runs its most tool calls at once", "quota", 0.0)
            return ToolOutcome(skipped, ResultSource.UNCACHED, origin)
        else:
            async with slots.slot(tenant):
                outcome = await self._call(name, arguments, tenant, program_id, origin)
        outcome = replace(outcome, waited_s=time.monotonic() - started)
        if self._observe is not None:
            self._observe(name, outcome, origin)
        return outcome

    async def _call(
        self,
        name: str,
        arguments: str | dict[str, Any] | None,
        tenant: str,
        program_id: str,
        origin: str,
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
        call = _sandbox_call(tool, parsed)
        if tool.spec.reads_state_only:
            return await self._read_state(tool, call, tenant, program_id, origin)
        if tool.spec.state_slot is not None:
            result = await self._run_stateful(call, tool.spec.state_slot, tenant, program_id)
            return ToolOutcome(result, ResultSource.UNCACHED, origin)
        if self._cache is None or not tool.spec.side_effect_free:
            return ToolOutcome(await self._run_call(call), ResultSource.UNCACHED, origin)
        return await self._single_flight(
            self._cache, self.cache_key(name, parsed, tenant, program_id), tool, call, origin
        )

    @property
    def runs_partial_calls(self) -> bool:
        return self._partial is not None

    def takes_partial_input(self, name: str) -> bool:
        """Would a call of `name` start before its arguments are whole?"""
        tool = self._registry.get(name)
        return (
            tool is not None
            and tool.spec.partial_input is not None
            and tool.spec.state_slot is None
        )

    def start_partial(self, name: str, call_index: int) -> PartialRun | None:
        """Starts a call of hosted tool `name` on the pool before its arguments are
        whole, if the tool takes partial input (and is stateless: a stateful call
        runs whole, under its program's lock); None otherwise."""
        tool = self._registry.get(name)
        if self._partial is None or tool is None or not self.takes_partial_input(name):
            return None
        assert tool.spec.partial_input is not None
        call_id = uuid.uuid4().hex
        call = _sandbox_call(tool, {})
        if self._partial.observer is not None:
            self._partial.observer.partial_started(name)
        return PartialRun(
            name,
            call_id,
            PieceSplitter(tool.spec.partial_input, call_index),
            self._partial.channel,
            asyncio.create_task(self._partial.run(call, call_id)),
            self._partial.observer,
        )

    async def finish_partial(
        self, run: PartialRun, arguments: dict[str, Any]
    ) -> ToolOutcome | None:
        """The partial run's outcome, given the call's whole arguments; None when
        the run broke (the caller runs the call whole instead)."""
        started = time.monotonic()
        result = await run.finish(arguments)
        if result is None:
            return None
        outcome = ToolOutcome(
            result, ResultSource.UNCACHED, PARTIAL_ORIGIN, waited_s=time.monotonic() - started
        )
        if self._observe is not None:
            self._observe(run.name, outcome, PARTIAL_ORIGIN)
        return outcome

    async def _run_stateful(
        self, call: SandboxCall, slot: str, tenant: str, program_id: str
    ) -> ToolResult:
        try:
            lease_s = call.timeout_s + _STATE_LEASE_MARGIN_S
            async with self._states.hold(tenant, program_id, lease_s):
                contents = await self._states.load(tenant, program_id, slot)
                result = await self._run_call(replace(call, state=contents))
                if result.ok and result.state is not None:
                    await self._states.save(tenant, program_id, slot, result.state)
        except ToolStateUnavailable as error:
            return _state_unavailable(error)
        return replace(result, state=None)

    async def _read_state(
        self, tool: HostedTool, call: SandboxCall, tenant: str, program_id: str, origin: str
    ) -> ToolOutcome:
        """A call that only reads its program's state runs on a snapshot of the slot
        (one atomic read, no lock: it cannot change what another call sees), and
        whatever it leaves is dropped. Its result is shared like a side-effect-free
        tool's, keyed by the snapshot's version: a speculation run before the model
        makes the call is used only if no call changed the state in between."""
        assert tool.spec.state_slot is not None
        try:
            contents = await self._states.load(tenant, program_id, tool.spec.state_slot)
        except ToolStateUnavailable as error:
            return ToolOutcome(_state_unavailable(error), ResultSource.UNCACHED, origin)
        call = replace(call, state=contents)
        if self._cache is None:
            outcome = ToolOutcome(await self._run_call(call), ResultSource.UNCACHED, origin)
        else:
            scope = CacheScope(tenant, program_id, contents.version())
            key = str(ToolCallKey.of(scope, tool.spec.name, call.arguments))
            outcome = await self._single_flight(self._cache, key, tool, call, origin)
        return replace(outcome, result=replace(outcome.result, state=None))

    async def _single_flight(
        self, cache: ToolCache, key: str, tool: HostedTool, call: SandboxCall, origin: str
    ) -> ToolOutcome:
        lease_s = tool.spec.timeout_s + self._cache_config.pending_lease_s
        while True:
            claim = await cache.claim(key, lease_s, origin)
            if claim.claimed:
                result = await self._run_call(call)
                keep_alive = tool.keep_alive_s if result.ok else _ERROR_KEEP_ALIVE_S
                await cache.complete(key, claim.token, _to_cache(result, origin), keep_alive)
                return ToolOutcome(result, ResultSource.RAN, origin)
            assert claim.existing is not None
            existing = claim.existing
            if existing.state != "pending":
                return ToolOutcome(_from_cache(existing), ResultSource.CACHED, existing.origin)
            finished = await cache.wait(key, lease_s)
            if finished is not None:
                return ToolOutcome(_from_cache(finished), ResultSource.AWAITED, finished.origin)
            # The runner's lease ran out (it died): claim the call again.


def _sandbox_call(tool: HostedTool, arguments: dict[str, Any]) -> SandboxCall:
    return SandboxCall(
        tool.function_reference,
        arguments,
        tool.options,
        tool.spec.timeout_s,
        starts_programs=tool.spec.starts_programs,
    )

"""The global tool cache and single-flight execution, against the real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tool_paths import owned_by_tools

from cluster.config import HostedToolConfig, SandboxLimits, ToolCacheConfig, ToolsConfig
from cluster.store.tool_cache import CachedToolResult, ToolCache
from cluster.store.tool_state import LocalToolStateStore
from toolworkers.execution import ResultSource, ToolExecutor, ToolOutcome
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed


@pytest.fixture()
def cache_url(redis_url: str) -> Iterator[str]:
    """A database of its own: the bounded-size test evicts by a global index."""
    base, _, _ = redis_url.rpartition("/")
    url = f"{base}/13"
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _with_cache(url: str, max_entries: int = 1000) -> ToolCache:
    return ToolCache(url, max_entries)


def test_claim_then_complete_then_read(cache_url: str) -> None:
    async def scenario() -> None:
        cache = await _with_cache(cache_url)
        key = unique("key")
        first = await cache.claim(key, lease_s=5)
        assert first.claimed and first.token
        second = await cache.claim(key, lease_s=5)
        assert not second.claimed
        assert second.existing == CachedToolResult("pending", "", None)
        done = CachedToolResult("done", "42", None)
        assert await cache.complete(key, first.token, done, keep_alive_s=5)
        assert await cache.get(key) == done
        third = await cache.claim(key, lease_s=5)
        assert (third.claimed, third.existing) == (False, done)
        await cache.close()

    asyncio.run(scenario())


def test_first_result_wins_and_a_client_post_overrides(cache_url: str) -> None:
    async def scenario() -> None:
        cache = await _with_cache(cache_url)
        key = unique("key")
        claim = await cache.claim(key, lease_s=5)
        stranger = await cache.complete(
            key, "not-the-owner", CachedToolResult("done", "x", None), 5
        )
        assert not stranger, "only the claim's holder completes a pending call"
        assert await cache.complete(key, claim.token, CachedToolResult("done", "a", None), 5)
        assert not await cache.complete(key, claim.token, CachedToolResult("done", "b", None), 5)
        assert await cache.complete(key, "", CachedToolResult("done", "client", None), 5)
        assert (await cache.get(key)) == CachedToolResult("done", "client", None)
        await cache.close()

    asyncio.run(scenario())


def test_entries_expire_with_their_keep_alive_and_leases_run_out(cache_url: str) -> None:
    async def scenario() -> None:
        cache = await _with_cache(cache_url)
        key = unique("key")
        claim = await cache.claim(key, lease_s=5)
        await cache.complete(key, claim.token, CachedToolResult("done", "v", None), 0.2)
        await asyncio.sleep(0.4)
        assert await cache.get(key) is None
        abandoned = unique("key")
        await cache.claim(abandoned, lease_s=0.2)
        assert await cache.wait(abandoned, timeout_s=5) is None, "the lease ran out"
        assert (await cache.claim(abandoned, lease_s=5)).claimed
        await cache.close()

    asyncio.run(scenario())


def test_size_is_bounded_evicting_the_soonest_to_expire(cache_url: str) -> None:
    async def scenario() -> None:
        cache = await _with_cache(cache_url, max_entries=3)
        keys = [unique(f"key{n}") for n in range(5)]
        for n, key in enumerate(keys):
            claim = await cache.claim(key, lease_s=5)
            await cache.complete(key, claim.token, CachedToolResult("done", str(n), None), 60 + n)
        present = [await cache.get(key) is not None for key in keys]
        assert present == [False, False, True, True, True]
        await cache.close()

    asyncio.run(scenario())


def test_redis_down_means_no_cache_but_calls_still_run() -> None:
    async def scenario() -> None:
        cache = ToolCache("redis://127.0.0.1:1/0", 10)
        claim = await cache.claim("key", lease_s=5)
        assert claim.claimed
        assert await cache.get("key") is None
        assert not await cache.complete("key", claim.token, CachedToolResult("done", "", None), 5)
        await cache.close()

    asyncio.run(scenario())


LIMITS = SandboxLimits(memory_mb=512, cpu_s=30, max_output_bytes=64 * 1024)


def tools_config(*hosted: HostedToolConfig) -> ToolsConfig:
    return ToolsConfig(hosted=list(hosted), cache=ToolCacheConfig(keep_alive_s=60))


def test_concurrent_requesters_across_processes_run_a_call_once(
    cache_url: str, tmp_path: Path
) -> None:
    """Eight executors, each with its own Redis client as separate replicas would
    have, ask for the same call at once: the tool runs once, all get its result."""
    ledger = tmp_path / "runs.log"
    config = tools_config(
        HostedToolConfig(
            function="tool_cache_probes:slow_lookup",
            options={"ledger": owned_by_tools(ledger, create_file=True)},
        )
    )
    registry = ToolRegistry.from_config(config)
    program = unique("program")

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, LIMITS.model_copy(update={"network": False}))

    async def scenario() -> list[tuple[str, ResultSource]]:
        caches = [ToolCache(cache_url, 1000) for _ in range(8)]
        executors = [
            ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
            for cache in caches
        ]
        # Key order and formatting differ between requesters; the call is the same.
        spellings = ['{"city": "Paris", "days": 2}', '{"days":2.0,"city":"Paris"}']
        outcomes = await asyncio.gather(
            *(
                executor.call("slow_lookup", spellings[n % 2], tenant="t", program_id=program)
                for n, executor in enumerate(executors)
            )
        )
        for cache in caches:
            await cache.close()
        return [(outcome.result.output, outcome.source) for outcome in outcomes]

    results = asyncio.run(scenario())
    assert ledger.read_text().count("ran") == 1
    assert {output for output, _ in results} == {"Paris for 2 days"}
    sources = [source for _, source in results]
    assert sources.count(ResultSource.RAN) == 1
    assert set(sources) <= {ResultSource.RAN, ResultSource.AWAITED, ResultSource.CACHED}

    async def again() -> ResultSource:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
        outcome = await executor.call(
            "slow_lookup", {"city": "Paris", "days": 2}, tenant="t", program_id=program
        )
        other_program = await executor.call(
            "slow_lookup", {"city": "Paris", "days": 2}, tenant="t", program_id=unique("p")
        )
        await cache.close()
        assert other_program.source is ResultSource.RAN, "program-scoped results stay put"
        return outcome.source

    assert asyncio.run(again()) is ResultSource.CACHED
    assert ledger.read_text().count("ran") == 2


def test_tools_with_side_effects_are_never_cached(cache_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "runs.log"
    config = tools_config(
        HostedToolConfig(
            function="tool_cache_probes:append_line",
            options={"ledger": owned_by_tools(ledger, create_file=True)},
        )
    )
    registry = ToolRegistry.from_config(config)

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, LIMITS)

    async def scenario() -> list[ResultSource]:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
        sources = []
        for _ in range(2):
            outcome = await executor.call("append_line", {"text": "x"}, tenant="t", program_id="p")
            sources.append(outcome.source)
        await cache.close()
        return sources

    assert asyncio.run(scenario()) == [ResultSource.UNCACHED, ResultSource.UNCACHED]
    assert ledger.read_text().splitlines() == ["x", "x"]


def test_failures_are_shared_briefly_then_retried(cache_url: str, tmp_path: Path) -> None:
    config = tools_config(HostedToolConfig(function="tool_cache_probes:always_fails"))
    registry = ToolRegistry.from_config(config)

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, LIMITS)

    async def scenario() -> list[tuple[bool, ResultSource]]:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
        program = unique("p")
        outcomes = [await executor.call("always_fails", {}, tenant="t", program_id=program)]
        outcomes.append(await executor.call("always_fails", {}, tenant="t", program_id=program))
        await asyncio.sleep(2.5)
        outcomes.append(await executor.call("always_fails", {}, tenant="t", program_id=program))
        await cache.close()
        return [(outcome.result.ok, outcome.source) for outcome in outcomes]

    assert asyncio.run(scenario()) == [
        (False, ResultSource.RAN),
        (False, ResultSource.CACHED),
        (False, ResultSource.RAN),
    ]


def test_unknown_tools_and_bad_arguments_do_not_run(cache_url: str) -> None:
    config = tools_config(HostedToolConfig(function="toolworkers.hosted_tools:calculator"))
    registry = ToolRegistry.from_config(config)

    async def must_not_run(call: SandboxCall) -> ToolResult:
        raise AssertionError("nothing should run")

    async def scenario() -> tuple[str | None, str | None]:
        executor = ToolExecutor(registry, must_not_run, None, config.cache, LocalToolStateStore(60))
        unknown = await executor.call("rm_rf", {}, tenant="t", program_id="p")
        malformed = await executor.call("calculator", "{oops", tenant="t", program_id="p")
        return unknown.result.error_kind, malformed.result.error_kind

    assert asyncio.run(scenario()) == ("unknown_tool", "bad_arguments")


def test_client_posted_results_answer_client_tools_of_their_program_only(cache_url: str) -> None:
    config = tools_config(HostedToolConfig(function="toolworkers.hosted_tools:calculator"))
    registry = ToolRegistry.from_config(config)

    async def must_not_run(call: SandboxCall) -> ToolResult:
        raise AssertionError("client tools never run in the cluster")

    async def scenario() -> None:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(
            registry, must_not_run, cache, config.cache, LocalToolStateStore(60)
        )
        program = unique("p")

        async def resolve(
            arguments: str, program_id: str = program, wait_s: float = 0.0
        ) -> str | None:
            outcome = await executor.resolve(
                "get_weather",
                arguments,
                tenant="t",
                program_id=program_id,
                client_result_wait_s=wait_s,
                hosted=False,
            )
            return None if outcome is None else outcome.result.output

        assert await resolve('{"city": "Paris"}') is None
        assert await executor.post_client_result(
            "get_weather", {"city": "Paris"}, "sunny", None, tenant="t", program_id=program
        )
        assert await resolve('{ "city":"Paris" }') == "sunny"
        assert await resolve('{"city": "Rome"}') is None
        assert await executor.post_client_result(  # kept for max_posted_keep_alive_s
            "get_weather", {"city": "Lima"}, "mild", 1e300, tenant="t", program_id=program
        )
        assert await resolve('{"city": "Lima"}') == "mild"
        assert await resolve('{"city": "Paris"}', program_id=unique("other")) is None
        assert await resolve("{not json") is None

        late = asyncio.create_task(resolve('{"city": "Oslo"}', wait_s=5.0))
        await asyncio.sleep(0.2)
        await executor.post_client_result(
            "get_weather", '{"city": "Oslo"}', "snow", 30, tenant="t", program_id=program
        )
        assert await late == "snow", "a result posted while the server waits is used"
        await cache.close()

    asyncio.run(scenario())


def test_resolve_runs_hosted_tools(cache_url: str) -> None:
    config = tools_config(HostedToolConfig(function="toolworkers.hosted_tools:calculator"))
    registry = ToolRegistry.from_config(config)

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, LIMITS)

    async def scenario() -> list[tuple[str, ResultSource]]:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
        expression = f'{{"expression": "6*7+{uuid.uuid4().int % 1000}-0"}}'
        outcomes = []
        for _ in range(2):
            outcome = await executor.resolve(
                "calculator",
                expression,
                tenant="t",
                program_id="p",
                client_result_wait_s=0,
                hosted=True,
            )
            assert outcome is not None
            outcomes.append((outcome.result.output, outcome.source))
        await cache.close()
        return outcomes

    (first, first_source), (second, second_source) = asyncio.run(scenario())
    assert first == second
    assert (first_source, second_source) == (ResultSource.RAN, ResultSource.CACHED)


def test_a_speculative_run_is_reused_with_its_origin_and_duration(
    cache_url: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "runs.log"
    config = tools_config(
        HostedToolConfig(
            function="tool_cache_probes:slow_lookup",
            options={"ledger": owned_by_tools(ledger, create_file=True)},
        )
    )
    registry = ToolRegistry.from_config(config)

    async def sandboxed(call: SandboxCall) -> ToolResult:
        return await run_sandboxed(call, LIMITS)

    async def scenario() -> tuple[ToolOutcome, ToolOutcome]:
        cache = ToolCache(cache_url, 1000)
        executor = ToolExecutor(registry, sandboxed, cache, config.cache, LocalToolStateStore(60))
        arguments = {"city": unique("city"), "days": 2}
        speculation = asyncio.create_task(
            executor.call(
                "slow_lookup", arguments, tenant="t", program_id="p", origin="speculation:draft"
            )
        )
        await asyncio.sleep(0.2)
        real = await executor.call("slow_lookup", arguments, tenant="t", program_id="p")
        return await speculation, real

    speculative, real = asyncio.run(scenario())
    assert speculative.source is ResultSource.RAN and speculative.origin == "speculation:draft"
    assert real.source is ResultSource.AWAITED and real.origin == "speculation:draft"
    assert real.result.output == speculative.result.output
    assert real.result.duration_s == speculative.result.duration_s > 0.5
    assert real.waited_s < speculative.waited_s
    assert ledger.read_text().splitlines() == ["ran"]

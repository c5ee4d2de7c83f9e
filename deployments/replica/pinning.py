"""The replica's side of pinning: tells the engine how each turn ended, fits the
prefill-time profile at start, and exports the engine's pinning stats as metrics."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.openai_protocol import reply_tool_calls
from cluster.policies.ttl_cost_model import PrefillProfile
from cluster.store.pins import PinStore
from deployments.engine.plugin import UTILITY_METHOD, EngineOperation
from deployments.replica.engine_stats import poll_engine_stats

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger("toolserve.pinning.replica")

_TTL_BOUNDARIES = [0.25, 0.5, 1, 2, 4, 8, 15, 30, 60]
_SHARE_BOUNDARIES = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]
_TOOL_DURATION_BOUNDARIES = [0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120]


def tool_called(reply: dict[str, Any]) -> str | None:
    """Name of the first tool a chat completion calls, None if it calls none."""
    return next((call.name for call in reply_tool_calls(reply) if call.name), None)


def profile_lengths(configured: list[int], max_model_len: int) -> list[int]:
    """The configured prompt lengths that fit the engine; at least three, so a
    short max_model_len still gets a quadratic fit over its own range."""
    lengths = {length for length in configured if length < max_model_len}
    if len(lengths) < 3:
        lengths |= {max_model_len // 4, max_model_len // 2, max_model_len - 64}
    return sorted(length for length in lengths if length > 0)


# Part of a cached profile's key: a profile measured another way is measured again.
PROFILE_METHOD = "warm-engine-v2"


def profile_cache_path(cache_dir: Path, fingerprint: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / "prefill-profiles" / f"{digest}.json"


class EnginePinning:
    """One replica's control of its engine's pins."""

    def __init__(
        self,
        engine: AsyncLLM,
        configured_lengths: list[int],
        max_model_len: int,
        replica_id: str,
        redis_url: str | None,
    ):
        self._engine = engine
        self._replica_id = replica_id
        self._redis_url = redis_url
        self._lengths = profile_lengths(configured_lengths, max_model_len)
        self._background: set[asyncio.Task[Any]] = set()
        self._metrics: _PinningMetrics | None = None

    async def _control(self, operation: EngineOperation, *arguments: Any) -> Any:
        return await self._engine.engine_core.call_utility_async(
            UTILITY_METHOD, operation, list(arguments)
        )

    def turn_ended(self, program_id: str, tool: str | None) -> None:
        """Fire and forget: a reply never waits for the engine's bookkeeping."""
        self._spawn(self._control(EngineOperation.TURN_ENDED, program_id, tool))

    async def end_program(self, program_id: str) -> None:
        await self._control(EngineOperation.END_PROGRAM, program_id)

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self._control(EngineOperation.STATS)
        return stats

    async def start(self, cache_dir: Path, fingerprint: dict[str, Any]) -> None:
        """Load or measure the prefill profile, then export stats periodically."""
        self._metrics = _PinningMetrics()
        self._spawn(self._export_stats())
        if self._redis_url is not None:
            self._spawn(self._follow_control_channel(self._redis_url))
        path = profile_cache_path(
            cache_dir,
            fingerprint | {"lengths": self._lengths, "method": PROFILE_METHOD},
        )
        profile: PrefillProfile | None
        try:
            profile = PrefillProfile(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            profile = await self._measure_prefill_profile()
            if profile is None:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(vars(profile)))
        await self._control(EngineOperation.SET_PREFILL_PROFILE, profile.a, profile.b, profile.c)
        logger.info("prefill profile: %s", profile)

    async def _measure_prefill_profile(self) -> PrefillProfile | None:
        from vllm import SamplingParams

        if len(self._lengths) < 3:
            logger.warning("max_model_len too short for a prefill profile")
            return None
        generator = random.Random(0)

        async def prefill_seconds(length: int) -> float:
            # Fresh random tokens, so the prefix cache cannot shorten the prefill.
            prompt = [generator.randrange(1000, 20000) for _ in range(length)]
            started = time.perf_counter()
            async for _ in self._engine.generate(
                {"prompt_token_ids": prompt},
                SamplingParams(max_tokens=1),
                request_id=f"toolserve-prefill-profile-{length}-{generator.random()}",
            ):
                pass
            return time.perf_counter() - started

        # The engine's first steps after start-up run cold (kernels, allocator,
        # caches): timed, they priced every re-prefill at seconds whatever its
        # length. One untimed prefill warms it.
        await prefill_seconds(self._lengths[0])
        seconds = [await prefill_seconds(length) for length in self._lengths]
        return PrefillProfile.fit(self._lengths, seconds)

    async def _export_stats(self) -> None:
        metrics = self._metrics
        if metrics is not None:
            await poll_engine_stats("pinning", self.stats, metrics.record)

    async def _follow_control_channel(self, redis_url: str) -> None:
        """Ends programs the client closed and releases pins of programs the router
        moved, whichever replica the request reached."""
        store = PinStore(redis_url)
        try:
            async for message in store.control_messages():
                if message.replica_id not in (None, self._replica_id):
                    continue
                try:
                    await self._control(EngineOperation(message.operation), message.program_id)
                except Exception as error:  # the engine may be restarting
                    logger.warning("pinning control %s failed: %s", message, error)
        finally:
            await store.close()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def stop(self) -> None:
        for task in self._background:
            task.cancel()


_PIN_COUNTERS = {
    "pins_created": ("toolserve_kv_pins", "KV pins created after tool-calling turns."),
    "pin_hits": (
        "toolserve_kv_pin_hits",
        "Returning turns admitted while their program's KV was still pinned.",
    ),
    "returning_turns": (
        "toolserve_kv_returning_turns",
        "Turns of programs that had finished a turn on this engine before.",
    ),
    "reused_prefix_tokens": (
        "toolserve_kv_pin_reused_prefix_tokens",
        "Prompt tokens returning turns found cached while pinned.",
    ),
    "programs_held": (
        "toolserve_programs_held",
        "Programs new to the engine whose first turn program admission held back "
        "(each counted once).",
    ),
}


class _PinningMetrics:
    """The engine's cumulative counters, exported as Ray Serve metrics."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Gauge, Histogram

        self._counters = {
            key: Counter(name, description=description)
            for key, (name, description) in _PIN_COUNTERS.items()
        }
        self._releases = Counter(
            "toolserve_kv_pin_releases",
            description=(
                "KV pins released, by reason (next_turn, expiry, program_end, pressure, moved)."
            ),
            tag_keys=("reason",),
        )
        self._pinned_token_seconds = Counter(
            "toolserve_kv_pinned_token_seconds",
            description="Context tokens times seconds pins held KV, by outcome: used (the "
            "program came back to its pin) or wasted (expired, displaced, moved, or the "
            "program ended first).",
            tag_keys=("outcome",),
        )
        self._pinned_blocks = Gauge(
            "toolserve_kv_pinned_blocks", description="KV blocks pins hold now."
        )
        self._pinned_tokens = Gauge(
            "toolserve_kv_pinned_tokens", description="Context tokens of the pinned programs."
        )
        self._free_blocks = Gauge(
            "toolserve_kv_free_blocks",
            description="KV blocks free in the engine now (idle and unpinned: all but one, "
            "the block vLLM reserves), read even while the engine is idle.",
        )
        self._ttl = Histogram(
            "toolserve_kv_pin_ttl_s",
            description="TTL chosen for each pin once its tool was known.",
            boundaries=_TTL_BOUNDARIES,
        )
        self._holding_cost = Histogram(
            "toolserve_kv_pin_holding_cost",
            description="Share of a pin's blocks waiting requests needed beyond the "
            "free ones when its TTL was chosen (the cost model's charge per second held).",
            boundaries=_SHARE_BOUNDARIES,
        )
        self._tool_duration = Histogram(
            "toolserve_tool_duration_s",
            description="Gap between a turn's end and the program's next turn, by tool.",
            boundaries=_TOOL_DURATION_BOUNDARIES,
            tag_keys=("tool",),
        )
        self._seen: dict[str, float] = {}

    def _increase(self, key: str, total: float) -> float:
        delta = total - self._seen.get(key, 0.0)
        self._seen[key] = total
        return max(delta, 0.0)

    def record(self, stats: dict[str, Any]) -> None:
        for key, counter in self._counters.items():
            if delta := self._increase(key, stats[key]):
                counter.inc(delta)
        for reason, total in stats["releases"].items():
            if delta := self._increase(f"release:{reason}", total):
                self._releases.inc(delta, tags={"reason": reason})
        for outcome, total in stats["pinned_token_seconds"].items():
            if delta := self._increase(f"held:{outcome}", total):
                self._pinned_token_seconds.inc(delta, tags={"outcome": outcome})
        self._pinned_blocks.set(stats["pinned_blocks"])
        self._pinned_tokens.set(stats["pinned_tokens"])
        self._free_blocks.set(stats["free_blocks"])
        for ttl in stats["chosen_ttls_s"]:
            self._ttl.observe(ttl)
        for share in stats["holding_costs"]:
            self._holding_cost.observe(share)
        for tool, duration in stats["tool_durations_s"]:
            self._tool_duration.observe(duration, tags={"tool": tool})

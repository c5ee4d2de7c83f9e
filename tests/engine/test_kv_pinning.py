"""KV pinning in a real vLLM engine (CPU backend, tiny random model) whose KV cache
holds 64 blocks of 64 tokens, so other programs' traffic really evicts."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.sim.decisions import read_decision_log, simulated_decisions
from cluster.config import EngineConfig
from cluster.models import EMBEDDED_SCHEME, TINY_RANDOM_LLAMA, resolve_model
from cluster.openai_protocol import LAST_STEP_ARG, RETAIN_FOR_ARG
from cluster.policies.pinning_log import first_difference
from cluster.store.pins import TtlLedger
from deployments.engine.pinning.settings import EnginePinningSettings
from deployments.engine.plugin import UTILITY_METHOD
from deployments.engine.setup import create_engine_config

pytestmark = pytest.mark.engine

BLOCK = 64
KV_BLOCKS = 64
VOCAB_LOW, VOCAB_HIGH = 100, 40_000


def engine_config() -> EngineConfig:
    return EngineConfig(
        model=EMBEDDED_SCHEME + TINY_RANDOM_LLAMA,
        served_model_name="tiny",
        dtype="float32",
        max_model_len=3584,
        block_size=BLOCK,
        enforce_eager=True,
        kv_cache_memory_bytes=KV_BLOCKS * BLOCK * 1024,  # 1 KiB of KV per token
        max_num_seqs=8,
    )


class Engine:
    def __init__(self, engine: Any):
        self.engine = engine

    async def turn(
        self,
        prompt: list[int],
        program_id: str | None,
        max_tokens: int = 8,
        last_step: bool = False,
        priority: int = 0,
        extra_args: dict[str, Any] | None = None,
    ) -> tuple[list[int], int]:
        """Runs one turn; returns its whole context (prompt + output) and cached tokens."""
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            temperature=0,
            extra_args=({LAST_STEP_ARG: 1} if last_step else {}) | (extra_args or {}) or None,
        )
        final = None
        async for output in self.engine.generate(
            {"prompt_token_ids": prompt},
            params,
            request_id=uuid.uuid4().hex,
            session_id=program_id,
            priority=priority,
        ):
            final = output
        assert final is not None and final.finished
        context = prompt + list(final.outputs[0].token_ids)
        return context, final.num_cached_tokens or 0

    async def control(self, operation: str, *arguments: Any) -> Any:
        return await self.engine.engine_core.call_utility_async(
            UTILITY_METHOD, operation, list(arguments)
        )


def tokens(count: int, seed: int) -> list[int]:
    generator = random.Random(seed)
    return [generator.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(count)]


async def flood(engine: Engine, seed: int, requests: int = 6) -> None:
    """Other agents' one-off requests: together far more KV than the cache holds."""
    for index in range(requests):
        await engine.turn(tokens(1536, seed * 100 + index), program_id=None)


async def decode_without_program(
    engine: Engine, max_tokens: int, seed: int, decoding: asyncio.Event
) -> None:
    """A request of no program that decodes `max_tokens`, setting `decoding` once it does."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    async for _ in engine.engine.generate(
        {"prompt_token_ids": tokens(64, seed)}, params, request_id=uuid.uuid4().hex
    ):
        decoding.set()


@pytest.fixture(scope="module")
def event_loop_runner() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    # Engines leave their output handlers pending; end them before the loop closes.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


def start_engine(
    loop: asyncio.AbstractEventLoop, cache_dir: Path, pinning: EnginePinningSettings | None
) -> Engine:
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model = resolve_model(EMBEDDED_SCHEME + TINY_RANDOM_LLAMA, cache_dir)
    _, vllm_config = create_engine_config(
        engine_config().engine_kwargs(model), pinning, disable_log_stats=True
    )

    async def create() -> Any:
        return AsyncLLM.from_vllm_config(vllm_config)

    return Engine(loop.run_until_complete(create()))


def in_place_of(
    previous: Engine,
    loop: asyncio.AbstractEventLoop,
    cache_dir: Path,
    pinning: EnginePinningSettings | None,
) -> Iterator[Engine]:
    """A module fixture's engine started once `previous` is shut down (two engines
    would not fit the cores)."""
    previous.engine.shutdown()
    engine = start_engine(loop, cache_dir, pinning)
    yield engine
    engine.engine.shutdown()


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    return Path(os.environ.get("TOOLSERVE_CACHE_DIR", Path.home() / ".cache" / "toolserve"))


@pytest.fixture(scope="module")
def replica_id() -> str:
    return f"engine-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def decision_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pinning-decisions")


@pytest.fixture(scope="module")
def pinned_engine(
    event_loop_runner: asyncio.AbstractEventLoop,
    cache_dir: Path,
    redis_url: str,
    replica_id: str,
    decision_log_dir: Path,
) -> Iterator[Engine]:
    settings = EnginePinningSettings(
        mode="fixed",
        fixed_ttl_s=60,
        max_ttl_s=60,
        max_pinned_fraction=0.5,
        replica_id=replica_id,
        redis_url=redis_url,
        decision_log_dir=str(decision_log_dir),
    )
    engine = start_engine(event_loop_runner, cache_dir, settings)
    yield engine
    engine.engine.shutdown()


def run(loop: asyncio.AbstractEventLoop, awaitable: Any) -> Any:
    return loop.run_until_complete(awaitable)


def test_pinned_turn_survives_other_traffic(
    pinned_engine: Engine,
    event_loop_runner: asyncio.AbstractEventLoop,
    redis_url: str,
    replica_id: str,
) -> None:
    program = f"agent-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[list[int], int]:
        context, _ = await pinned_engine.turn(tokens(1024, 1), program)
        await pinned_engine.control("turn_ended", program, "run_tests")
        await flood(pinned_engine, seed=2)
        _, cached = await pinned_engine.turn(context + tokens(64, 3), program)
        return context, cached

    ledger = TtlLedger(redis_url)
    context, cached = run(event_loop_runner, scenario())
    assert cached >= 0.9 * len(context), (cached, len(context))
    stats = run(event_loop_runner, pinned_engine.control("stats"))
    assert stats["pin_hits"] >= 1
    assert stats["releases"].get("next_turn", 0) >= 1
    # The second turn is pinned in turn; the ledger shows it with this replica.
    deadline = time.time() + 5
    while (entry := ledger.lookup(program)) is None and time.time() < deadline:
        time.sleep(0.1)
    assert entry is not None and entry.replica_id == replica_id
    run(event_loop_runner, pinned_engine.control("end_program", program))
    deadline = time.time() + 5
    while ledger.lookup(program) is not None and time.time() < deadline:
        time.sleep(0.1)
    assert ledger.lookup(program) is None
    ledger.close()


def test_a_large_request_completes_by_unpinning(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    programs = [f"agent-{uuid.uuid4().hex[:8]}" for _ in range(3)]

    async def scenario() -> int:
        for seed, program in enumerate(programs, start=10):
            await pinned_engine.turn(tokens(640, seed), program)  # 11 blocks each
            await pinned_engine.control("turn_ended", program, "read_file")
        # 3300 tokens = 52 blocks: only fits once most pins are gone.
        context, _ = await asyncio.wait_for(
            pinned_engine.turn(tokens(3300, 20), None, max_tokens=4), timeout=120
        )
        return len(context)

    before = run(event_loop_runner, pinned_engine.control("stats"))
    assert run(event_loop_runner, scenario()) == 3304
    after = run(event_loop_runner, pinned_engine.control("stats"))
    assert after["releases"].get("pressure", 0) > before["releases"].get("pressure", 0)
    for program in programs:
        run(event_loop_runner, pinned_engine.control("end_program", program))


def test_under_pressure_the_less_important_programs_pin_goes_first(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop, redis_url: str
) -> None:
    background, important = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("bg", "vip"))

    async def scenario() -> tuple[list[int], int]:
        # The background program arrives first: by arrival alone it would keep its pin.
        await pinned_engine.turn(tokens(640, 90), background, priority=5)
        await pinned_engine.control("turn_ended", background, "read_file")
        context, _ = await pinned_engine.turn(tokens(640, 91), important, priority=-5)
        await pinned_engine.control("turn_ended", important, "read_file")
        # 44 blocks: the free ones and one program's pin (11 blocks each).
        await asyncio.wait_for(pinned_engine.turn(tokens(2800, 92), None, max_tokens=4), 120)
        _, cached = await pinned_engine.turn(context + tokens(32, 93), important, priority=-5)
        return context, cached

    ledger = TtlLedger(redis_url)
    before = run(event_loop_runner, pinned_engine.control("stats"))
    context, cached = run(event_loop_runner, scenario())
    after = run(event_loop_runner, pinned_engine.control("stats"))
    assert after["releases"].get("pressure", 0) == before["releases"].get("pressure", 0) + 1
    assert cached >= 0.9 * len(context), (cached, len(context))
    deadline = time.time() + 5
    while ledger.lookup(background) is not None and time.time() < deadline:
        time.sleep(0.1)
    assert ledger.lookup(background) is None, "the background program kept its pin"
    for program in (background, important):
        run(event_loop_runner, pinned_engine.control("end_program", program))
    ledger.close()


def test_a_pin_past_its_hinted_ttl_is_still_a_cached_prefix(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    program = f"retain-{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[list[int], int]:
        retain = {RETAIN_FOR_ARG: 0.5}
        context, _ = await pinned_engine.turn(tokens(640, 95), program, extra_args=retain)
        await pinned_engine.control("turn_ended", program, "read_file")
        await asyncio.sleep(1.0)
        await pinned_engine.turn(tokens(64, 96), None)  # a step, which expires the pin
        _, cached = await pinned_engine.turn(context + tokens(32, 97), program)
        return context, cached

    before = run(event_loop_runner, pinned_engine.control("stats"))
    context, cached = run(event_loop_runner, scenario())
    after = run(event_loop_runner, pinned_engine.control("stats"))
    # The fixed TTL is 60 s: the hint's 0.5 s ended the pin, and its blocks stayed cached.
    assert after["releases"].get("expiry", 0) == before["releases"].get("expiry", 0) + 1
    assert after["pin_hits"] == before["pin_hits"]
    assert cached >= 0.9 * len(context), (cached, len(context))
    run(event_loop_runner, pinned_engine.control("end_program", program))


def test_last_step_pins_nothing(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    before = run(event_loop_runner, pinned_engine.control("stats"))["pins_created"]
    run(event_loop_runner, pinned_engine.turn(tokens(256, 30), "agent-last", last_step=True))
    assert run(event_loop_runner, pinned_engine.control("stats"))["pins_created"] == before


def test_no_blocks_leak_after_many_programs(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    async def program(index: int) -> None:
        program_id = f"leak-{index}-{uuid.uuid4().hex[:6]}"
        context, _ = await pinned_engine.turn(tokens(300, 100 + index), program_id)
        await pinned_engine.control("turn_ended", program_id, "tool")
        ending = index % 3
        if ending == 0:  # the program's last step carries the hint
            await pinned_engine.turn(context + tokens(20, 200 + index), program_id, last_step=True)
        elif ending == 1:  # a final answer (pinned like any turn), then the client closes
            await pinned_engine.turn(context + tokens(20, 200 + index), program_id)
            await pinned_engine.control("turn_ended", program_id, None)
            await pinned_engine.control("end_program", program_id)
        else:  # the client closes the session
            await pinned_engine.control("end_program", program_id)

    async def all_programs() -> None:
        await asyncio.gather(*(program(index) for index in range(24)))

    start = run(event_loop_runner, pinned_engine.control("stats"))
    run(event_loop_runner, all_programs())
    end = run(event_loop_runner, pinned_engine.control("stats"))
    assert end["pins_created"] >= start["pins_created"] + 24
    assert end["pinned_blocks"] == start["pinned_blocks"]
    assert end["free_blocks"] == start["free_blocks"]


def finish_order_of_newcomers_and_a_returning_turn(
    engine: Engine, loop: asyncio.AbstractEventLoop, returning_after_s: float
) -> list[str]:
    """Every slot busy, three new programs' first turns queue 0.1 s into it and an
    old program's returning turn `returning_after_s` into it; the slots then free
    one at a time. Returns the order the four finished in."""
    finish_order: list[str] = []

    async def tracked(
        name: str, prompt: list[int], program: str | None, delay: float, max_tokens: int
    ) -> None:
        await asyncio.sleep(delay)
        await engine.turn(prompt, program, max_tokens=max_tokens)
        finish_order.append(name)

    async def scenario() -> None:
        old = f"old-{uuid.uuid4().hex[:6]}"
        context, _ = await engine.turn(tokens(128, 40), old)
        await engine.control("turn_ended", old, "tool")
        # Eight requests of different lengths fill every slot (and fit the KV together)
        # and free them one at a time, the first well after everything below has
        # arrived.
        blockers = [
            tracked(f"blocker{index}", tokens(64, 50 + index), None, 0, 240 + 8 * index)
            for index in range(8)
        ]
        newcomers = [
            tracked(f"new{index}", tokens(64, 60 + index), f"new-{index}-{old}", 0.1, 4)
            for index in range(3)
        ]
        returning = tracked("old", context + tokens(16, 70), old, returning_after_s, 4)
        await asyncio.gather(*blockers, *newcomers, returning)
        for program in [old, *(f"new-{index}-{old}" for index in range(3))]:
            await engine.control("end_program", program)

    run(loop, scenario())
    return [name for name in finish_order if not name.startswith("blocker")]


def test_returning_turns_overtake_newer_programs(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    order = finish_order_of_newcomers_and_a_returning_turn(pinned_engine, event_loop_runner, 0.2)
    assert order[0] == "old", order


def test_an_earlier_programs_turn_is_admitted_past_later_programs_pins(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    finish_order: list[str] = []
    early, later = f"early-{uuid.uuid4().hex[:6]}", [f"later-{index}" for index in range(2)]

    async def blocker(decoding: asyncio.Event) -> None:
        await decode_without_program(pinned_engine, 900, 80, decoding)
        finish_order.append("blocker")

    async def scenario() -> None:
        context, _ = await pinned_engine.turn(tokens(128, 81), early)  # pins 2 blocks
        await pinned_engine.control("turn_ended", early, "tool")
        for seed, program in enumerate(later, start=82):  # 15 blocks each: the cap is full
            await pinned_engine.turn(tokens(960, seed), program)
            await pinned_engine.control("turn_ended", program, "tool")
        decoding = asyncio.Event()
        running = asyncio.create_task(blocker(decoding))
        await decoding.wait()
        # 37 blocks: more than the pins and the decoding request leave free, less
        # than the later programs' pins give back.
        await pinned_engine.turn(context + tokens(2200, 84), early, max_tokens=4)
        finish_order.append("early")
        await running
        for program in [early, *later]:
            await pinned_engine.control("end_program", program)

    before = run(event_loop_runner, pinned_engine.control("stats"))
    run(event_loop_runner, scenario())
    after = run(event_loop_runner, pinned_engine.control("stats"))
    # Without the admission rule the turn waits for the decoding request's blocks.
    assert finish_order == ["early", "blocker"]
    assert after["releases"].get("pressure", 0) > before["releases"].get("pressure", 0)


def test_the_simulators_controller_decides_as_the_engine_did_for_the_logged_events(
    pinned_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop, decision_log_dir: Path
) -> None:
    """The tests above, as the engine's pinning controller logged them, replayed
    through the controller the simulator builds from the logged configuration."""
    run(event_loop_runner, pinned_engine.control("stats"))  # the engine writes its log out
    (path,) = decision_log_dir.glob("*.jsonl")
    log = read_decision_log(path)
    reasons = Counter(reason for record in log[1:] for _, reason in record["released"])
    assert {"next_turn", "pressure", "expiry", "program_end"} <= set(reasons), reasons
    pins_made = sum(1 for record in log if record["event"] == "on_finished" and record["result"])
    assert pins_made >= 30, pins_made
    assert first_difference(log, simulated_decisions(log)) is None


@pytest.fixture(scope="module")
def stock_engine(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path, pinned_engine: Engine
) -> Iterator[Engine]:
    yield from in_place_of(pinned_engine, event_loop_runner, cache_dir, None)


def test_without_pinning_the_same_turn_is_evicted(
    stock_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    async def scenario() -> tuple[list[int], int]:
        context, _ = await stock_engine.turn(tokens(1024, 1), "agent-stock")
        await flood(stock_engine, seed=2)
        _, cached = await stock_engine.turn(context + tokens(64, 3), "agent-stock")
        return context, cached

    context, cached = run(event_loop_runner, scenario())
    assert cached < 0.1 * len(context), (cached, len(context))


@pytest.fixture(scope="module")
def horizon_engine(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path, stock_engine: Engine
) -> Iterator[Engine]:
    settings = EnginePinningSettings(
        mode="fixed", fixed_ttl_s=60, max_ttl_s=60, fcfs_horizon_s=0.1, replica_id="horizon"
    )
    yield from in_place_of(stock_engine, event_loop_runner, cache_dir, settings)


def test_with_a_horizon_a_returning_turn_no_longer_overtakes_programs_long_waiting(
    horizon_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    """The old program's turn queues 0.1 s before its own arrival, 0.3 s into the
    scenario: after the newcomers that have waited since 0.1 s."""
    order = finish_order_of_newcomers_and_a_returning_turn(horizon_engine, event_loop_runner, 0.3)
    assert order[-1] == "old", order


@pytest.fixture(scope="module")
def admission_engine(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path, horizon_engine: Engine
) -> Iterator[Engine]:
    settings = EnginePinningSettings(
        mode="fixed",
        fixed_ttl_s=60,
        max_ttl_s=60,
        program_admission_share=0.5,  # 2,048 of the pool's 4,096 tokens
        replica_id="admission",
    )
    yield from in_place_of(horizon_engine, event_loop_runner, cache_dir, settings)


def test_program_admission_holds_a_new_program_until_a_started_one_ends(
    admission_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    """A started program in its tool pause holds 1,544 tokens of the 2,048 budget, so
    a new program of 1,024 waits while another request keeps the engine busy, and
    starts as soon as the started program ends, before that request finishes."""
    finish_order: list[str] = []
    started, new = f"started-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"

    async def blocker(decoding: asyncio.Event) -> None:
        await decode_without_program(admission_engine, 3000, 90, decoding)
        finish_order.append("blocker")

    async def new_program() -> None:
        await admission_engine.turn(tokens(1024, 92), new, max_tokens=4)
        finish_order.append("new")

    async def scenario() -> int:
        await admission_engine.turn(tokens(1536, 91), started)
        await admission_engine.control("turn_ended", started, "tool")
        decoding = asyncio.Event()
        running = asyncio.create_task(blocker(decoding))
        await decoding.wait()
        held_before = (await admission_engine.control("stats"))["programs_held"]
        waiting = asyncio.create_task(new_program())
        held = held_before
        while held == held_before and not running.done():
            held = (await admission_engine.control("stats"))["programs_held"]
            await asyncio.sleep(0.05)
        assert held == held_before + 1
        assert not waiting.done() and not running.done()
        await admission_engine.control("end_program", started)
        await waiting
        await running
        await admission_engine.control("end_program", new)
        return held_before

    held_before = run(event_loop_runner, scenario())
    assert finish_order == ["new", "blocker"]
    assert held_before == 0


def test_program_admission_counts_a_shared_preamble_once(
    admission_engine: Engine, event_loop_runner: asyncio.AbstractEventLoop
) -> None:
    """The new program's prompt is the started program's 1,536-token prompt and 256
    tokens of its own: the preamble is cached, so it adds 256 tokens to the started
    program's 1,544, which fits the 2,048 budget; it starts while the other request
    still decodes, where a program of the same length sharing nothing is held (the
    test above)."""
    finish_order: list[str] = []
    started, new = f"started-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"
    preamble = tokens(1536, 95)

    async def blocker(decoding: asyncio.Event) -> None:
        await decode_without_program(admission_engine, 3000, 96, decoding)
        finish_order.append("blocker")

    async def scenario() -> int:
        await admission_engine.turn(preamble, started)
        await admission_engine.control("turn_ended", started, "tool")
        decoding = asyncio.Event()
        running = asyncio.create_task(blocker(decoding))
        await decoding.wait()
        held_before: int = (await admission_engine.control("stats"))["programs_held"]
        _, cached = await admission_engine.turn(preamble + tokens(256, 97), new, max_tokens=4)
        finish_order.append("new")
        assert cached >= 1536
        held_after: int = (await admission_engine.control("stats"))["programs_held"]
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        for program in (started, new):
            await admission_engine.control("end_program", program)
        return held_after - held_before

    newly_held = run(event_loop_runner, scenario())
    assert finish_order == ["new"]
    assert newly_held == 0

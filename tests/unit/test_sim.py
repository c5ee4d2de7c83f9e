"""The simulator: its block pool conserves blocks, its engine schedules as vLLM
does, and it drives the very pinning controller and routing policy the cluster
runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.sim.blocks import BlockPool
from bench.sim.drafts import DraftRates, NgramDrafts
from bench.sim.engine import PinningGlue, SimEngine, SimEngineSettings
from bench.sim.profile import StepProfile, TimedStep, fit_profile, step_work
from bench.sim.request import SimRequest
from bench.sim.routing import SessionHashRouting, ToolserveRouting
from bench.sim.run import engine_shape, simulate_programs, simulated_table
from bench.sim.simulation import SimProgram, SimTurn, Simulation, SimulationStuck
from bench.sim.step_time import StepTimeModel, StepWork
from bench.sim.systems import CATALOG, recorded_replicas, recorded_system
from bench.sim.validate import (
    ArmComparison,
    RatioComparison,
    draft_rates,
    run_errors,
    simulate_run,
)
from cluster.config import REPO_ROOT, PinningConfig, PromptLookupConfig, RoutingConfig
from cluster.policies.draft_gate import ProposalGate, gate_settings
from cluster.policies.pinning_controller import pinning_controller

STEP_TIME = StepTimeModel(
    base_s=0.01,
    prefill_token_s=0.001,
    prefill_attention_s=0.0,
    decode_sequence_s=0.002,
    decode_context_s=0.0,
)


def engine(blocks: int, pinned: bool = False, name: str = "r0") -> SimEngine:
    shape = SimEngineSettings(blocks=blocks, block_size=16, max_num_seqs=8, max_batched_tokens=256)
    glue = None
    if pinned:
        config = PinningConfig(mode="cost_model", program_fcfs=True)
        glue = PinningGlue(pinning_controller(config, blocks), program_fcfs=True)
    return SimEngine(name, shape, STEP_TIME, glue)


def test_a_pool_evicts_the_least_recently_freed_block_first() -> None:
    pool = BlockPool(4)
    first = pool.allocate(2)
    assert first is not None
    pool.cache(first[0], ("a", 0))
    pool.cache(first[1], ("a", 1))
    pool.release(reversed(first))  # the tail first: it is evicted first
    assert pool.free == 4 and pool.cached_prefix("a", 2) == first
    pool.allocate(3)  # the two empty blocks, then the context's tail
    assert pool.cached_prefix("a", 2) == first[:1]
    pool.check()


def test_a_block_cannot_be_released_more_often_than_taken() -> None:
    pool = BlockPool(2)
    taken = pool.allocate(1)
    assert taken is not None
    pool.release(taken)
    with pytest.raises(ValueError, match="released more often"):
        pool.release(taken)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("acrt"), st.integers(0, 5)), max_size=60))
def test_the_pool_conserves_blocks_under_any_operations(operations: list[tuple[str, int]]) -> None:
    pool = BlockPool(6)
    held: list[list[int]] = []
    for operation, number in operations:
        if operation == "a" and (taken := pool.allocate(number % 3 + 1)) is not None:
            for index, block_id in enumerate(taken):
                pool.cache(block_id, (f"p{number}", index))
            held.append(taken)
        elif operation == "c":
            prefix = pool.cached_prefix(f"p{number}", 3)
            pool.take(prefix)
            held.append(prefix)
        elif operation in "rt" and held:
            pool.release(reversed(held.pop(number % len(held))))
        pool.check()
    for blocks in held:
        pool.release(blocks)
    pool.check()
    assert pool.free == pool.total


def test_a_step_costs_what_it_computes() -> None:
    work = StepWork(prefills=((100, 0),), decodes=(50, 70))
    assert STEP_TIME.seconds(work) == pytest.approx(0.01 + 0.1 + 2 * 0.002)


def test_a_step_time_model_is_recovered_from_timed_steps() -> None:
    true = StepTimeModel(
        base_s=0.02,
        prefill_token_s=0.0005,
        prefill_attention_s=1e-8,
        decode_sequence_s=0.003,
        decode_context_s=1e-6,
    )
    steps = [
        StepWork(prefills=((new, before),), decodes=tuple([context] * sequences))
        for new, before, context, sequences in [
            (0, 0, 500, 1),
            (256, 0, 1000, 2),
            (512, 1024, 2000, 4),
            (64, 4096, 300, 8),
            (1024, 2048, 8000, 3),
            (128, 128, 4000, 6),
            (2048, 0, 100, 1),
        ]
    ]
    fitted = StepTimeModel.fit(steps, [true.seconds(step) for step in steps])
    for step in steps:
        assert fitted.seconds(step) == pytest.approx(true.seconds(step), rel=1e-6)


def test_a_turn_prefills_then_decodes_one_token_a_step_and_frees_its_blocks() -> None:
    replica = engine(blocks=32)
    request = SimRequest(0, "p", prompt_tokens=40, output_tokens=5, arrived_at=0.0)
    replica.add(request, 0.0)
    now, steps = 0.0, 0
    while replica.busy:
        result = replica.step(now)
        now += result.seconds
        steps += 1
    assert steps == 5  # the prefill samples the first token
    assert request.finished_at == pytest.approx(now)
    assert replica.counters.prompt_tokens_computed == 40
    assert replica.pool.free == 32
    assert len(replica.pool.cached_prefix("p", 10)) == 44 // 16  # full blocks stay cached


def _programs(
    count: int, turns: int, first: int, appended: int, pause_s: float
) -> list[SimProgram]:
    return [
        SimProgram(
            f"program-{index}",
            "agent",
            arrival_s=index * 0.5,
            first_prompt_tokens=first,
            turns=tuple(
                SimTurn(appended if turn else 0, 12, pause_s, tool="read_file")
                for turn in range(turns)
            ),
        )
        for index in range(count)
    ]


@settings(max_examples=25, deadline=None)
@given(
    count=st.integers(1, 8),
    turns=st.integers(1, 5),
    first=st.integers(1, 300),
    appended=st.integers(1, 120),
    pause_s=st.floats(0.0, 5.0),
    # From 56 blocks of 16 tokens, the longest context (300 + 4 x 120 + 5 x 12 tokens)
    # fits the pool; a smaller pool can never serve it.
    blocks=st.integers(56, 120),
    pinned=st.booleans(),
)
def test_every_program_finishes_and_every_block_comes_back(
    count: int, turns: int, first: int, appended: int, pause_s: float, blocks: int, pinned: bool
) -> None:
    replica = engine(blocks, pinned)
    result = Simulation([replica], SessionHashRouting()).run(
        _programs(count, turns, first, appended, pause_s)
    )
    assert all(outcome.finished_s is not None for outcome in result.programs)
    assert all(len(outcome.turns) == turns for outcome in result.programs)
    replica.pool.check()
    assert replica.pool.free == blocks
    assert replica.pinning is None or replica.pinning.pinned_blocks == 0


def test_the_same_programs_give_the_same_result() -> None:
    programs = _programs(6, 4, 200, 60, 1.5)
    runs = [
        Simulation([engine(48, pinned=True)], SessionHashRouting()).run(programs) for _ in range(2)
    ]
    assert [o.finished_s for o in runs[0].programs] == [o.finished_s for o in runs[1].programs]
    assert runs[0].engines == runs[1].engines


def test_a_pinned_program_finds_its_context_after_others_flooded_the_cache() -> None:
    """One program's tool runs while others, one after another, take the free
    blocks: stock's prefix cache gives up the context's tail, the pin kept all
    of it."""
    waiting = SimProgram(
        "slow-tool", "agent", 0.0, 400, (SimTurn(0, 12, 2.5, "run_tests"), SimTurn(30, 12, 0.0))
    )
    flood = [
        SimProgram(f"flood-{index}", "agent", 0.6 + 0.3 * index, 160, (SimTurn(0, 12, 0.0),))
        for index in range(6)
    ]
    cached = {}
    for pinned in (False, True):
        replica = engine(blocks=60, pinned=pinned)
        result = Simulation([replica], SessionHashRouting()).run([waiting, *flood])
        returning = next(o for o in result.programs if o.program_id == "slow-tool").turns[1]
        cached[pinned] = returning.cached_tokens
        assert result.preemptions == 0
    assert cached[True] == (400 + 12) // 16 * 16
    assert cached[False] < cached[True]


def test_a_context_larger_than_the_pool_is_reported_not_waited_for() -> None:
    with pytest.raises(SimulationStuck, match="cannot get its blocks"):
        Simulation([engine(blocks=4)], SessionHashRouting()).run(_programs(1, 1, 200, 0, 0.0))


def test_toolserve_routing_spreads_programs_and_keeps_each_on_its_replica() -> None:
    replicas = [engine(64, pinned=True, name=f"r{index}") for index in range(3)]
    routing = ToolserveRouting(RoutingConfig(), engine_batch_slots=8)
    result = Simulation(replicas, routing).run(_programs(3, 4, 100, 40, 0.5))
    for outcome in result.programs:
        assert len(set(outcome.replicas)) == 1, outcome.replicas
    assert len({outcome.replicas[0] for outcome in result.programs}) > 1


def _decode_steps(drafts: NgramDrafts | None) -> tuple[int, SimRequest]:
    shape = SimEngineSettings(blocks=64, block_size=16, max_num_seqs=8, max_batched_tokens=256)
    replica = SimEngine("r0", shape, STEP_TIME, drafts=drafts)
    request = SimRequest(0, "p", prompt_tokens=40, output_tokens=60, arrived_at=0.0)
    replica.add(request, 0.0)
    steps = 0
    while replica.busy:
        replica.step(0.0)
        steps += 1
    return steps, request


def test_accepted_drafts_write_several_tokens_a_step_and_exactly_the_output() -> None:
    rates = DraftRates(window=4, match_rate=1.0, acceptance=0.9, call_acceptance=0.9)
    plain, _ = _decode_steps(None)
    drafts = NgramDrafts(rates, seed=1)
    drafted, request = _decode_steps(drafts)
    assert plain == 60
    assert drafted < plain / 2
    assert request.generated == 60
    assert 0 < drafts.accepted <= drafts.drafted


def test_the_gate_withholds_drafts_above_its_decoders() -> None:
    rates = DraftRates(window=4, match_rate=1.0, acceptance=0.9, call_acceptance=0.9)
    closed = ProposalGate(gate_settings(PromptLookupConfig(max_decoders=0)))
    drafts = NgramDrafts(rates, seed=1, gate=closed)
    steps, _ = _decode_steps(drafts)
    assert steps == 60 and drafts.drafted == 0


def test_the_per_token_acceptance_gives_the_accepted_share() -> None:
    chance = DraftRates.acceptance_for(0.5, window=4)
    expected = sum(chance**position for position in range(1, 5)) / 4
    assert expected == pytest.approx(0.5, abs=1e-6)


def test_a_scheduled_step_is_read_as_prefill_chunks_decodes_and_drafts(tmp_path: Path) -> None:
    """vLLM's scheduler has already counted the step's tokens as computed."""
    scheduler = SimpleNamespace(
        requests={
            "new": SimpleNamespace(num_computed_tokens=256, num_prompt_tokens=600),
            "decoding": SimpleNamespace(num_computed_tokens=701, num_prompt_tokens=600),
            "drafted": SimpleNamespace(num_computed_tokens=905, num_prompt_tokens=800),
        }
    )
    output = SimpleNamespace(
        num_scheduled_tokens={"new": 256, "decoding": 1, "drafted": 4},
        scheduled_spec_decode_tokens={"drafted": [7, 8, 9]},
    )
    work = step_work(scheduler, output)
    assert work == StepWork(prefills=((256, 0),), decodes=(701, 902), drafts=3)
    timed = [
        TimedStep(StepWork(((n, c),), tuple([500] * d), k), 0.01 + 0.001 * n + 0.002 * d)
        for n, c, d, k in [(64, 0, 0, 0), (0, 0, 1, 0), (128, 64, 2, 3), (512, 0, 4, 0),
                           (0, 0, 8, 4), (32, 2048, 3, 0), (256, 256, 0, 0)]
    ]  # fmt: skip
    profile = fit_profile(
        timed,
        model="m",
        block_size=64,
        max_num_seqs=32,
        max_batched_tokens=2048,
        kv_bytes_per_token=46080,
    )
    assert profile.median_relative_error == pytest.approx(0.0, abs=1e-6)
    profile.save(tmp_path / "profile.json")
    assert StepProfile.load(tmp_path / "profile.json") == profile


def test_a_recorded_arm_is_simulated_with_the_policies_it_ran() -> None:
    stock = recorded_system(
        "stock-vllm",
        {"command": ["vllm", "--speculative-config", "{}"], "toolserve_config": None},
        drafted=False,  # the server's own command says
    )
    assert stock.pinning is None and stock.drafts == "ngram" and stock.routing == "session-hash"
    toolserve = recorded_system(
        "toolserve",
        {
            "toolserve_config": {
                "main": {
                    "pinning": {"mode": "fixed", "program_fcfs": True, "retired_setting": 1},
                    "prompt_lookup": {"enabled": True, "max_decoders": 3},
                }
            }
        },
        drafted=False,
    )
    assert toolserve.pinning is not None and toolserve.pinning.mode == "fixed"
    assert toolserve.pinning.idle_hold_factor > 1e6  # recorded before the factor existed
    assert toolserve.drafts == "gated" and toolserve.prompt_lookup.max_decoders == 3


def test_draft_rates_come_from_the_arm_that_verified_every_proposal() -> None:
    def work(drafted: float, accepted: float, generated: float) -> dict[str, object]:
        return {
            "work": {
                "draft_tokens": {"mean": drafted},
                "accepted_draft_tokens": {"mean": accepted},
                "generation_tokens": {"mean": generated},
            }
        }

    summary = {
        "systems": {"toolserve": work(100, 90, 1000), "stock-vllm": work(2000, 500, 1500)},
        "effective_configuration": {
            "toolserve": {"command": ["toolserve"]},
            "stock-vllm": {"command": ["vllm", "--speculative-config", "{}"]},
        },
    }
    rates = draft_rates(summary)
    assert rates is not None
    assert rates.match_rate == pytest.approx(2000 / (4 * 1000))
    expected = sum(rates.acceptance**position for position in range(1, 5)) / 4
    assert expected == pytest.approx(500 / 2000, abs=1e-6)


def test_a_prompt_waits_until_all_of_it_fits_not_just_its_first_chunk() -> None:
    replica = engine(blocks=40)  # a step computes 256 tokens: 16 blocks
    first = SimRequest(0, "a", prompt_tokens=400, output_tokens=40, arrived_at=0.0)
    second = SimRequest(1, "b", prompt_tokens=300, output_tokens=4, arrived_at=0.0)
    replica.add(first, 0.0)
    replica.step(0.0)
    replica.step(0.0)  # the first prompt is in: 25 blocks, 15 free
    replica.add(second, 0.0)
    replica.step(0.0)
    assert replica.waiting == [second]  # its first chunk would fit, its 19 blocks do not


def test_a_workload_is_simulated_on_each_systems_replicas() -> None:
    profile = StepProfile(
        step_time=STEP_TIME,
        model="m",
        machine="test",
        recorded="-",
        block_size=16,
        max_num_seqs=8,
        max_batched_tokens=256,
        kv_bytes_per_token=1024,
        steps=0,
    )
    shape = engine_shape(profile, kv_cache_mib=1)
    assert shape.blocks == 2**20 // 1024 // 16
    figures = simulate_programs(
        _programs(8, 3, 200, 50, 1.0),
        [CATALOG["stock-vllm-plain"], CATALOG["toolserve"]],
        2,
        shape,
        profile,
        None,
        seed=0,
    )
    assert [figure.system for figure in figures] == ["stock-vllm-plain", "toolserve"]
    for figure in figures:
        assert figure.programs == 8 and figure.replicas == 2
        assert 0 < figure.jct_mean_s <= figure.jct_p90_s
        assert 0.5 <= figure.busiest_replica_share < 1
    assert "| toolserve | 2 | 8 |" in simulated_table(figures)


def test_an_arm_behind_vllms_router_is_its_servers_behind_consistent_hashing() -> None:
    router_arm = {
        "command": [
            *("python", "-m", "bench.baselines.vllm_router", "--port", "1"),
            *("--bindings", "0", "1", "--on-nodes"),
        ],
        "toolserve_config": None,
    }
    drafted = recorded_system("stock-vllm-router", router_arm, drafted=True)
    assert drafted.pinning is None and drafted.routing == "session-hash"
    assert drafted.drafts == "ngram"
    assert recorded_system("stock-vllm-router", router_arm, drafted=False).drafts == "none"
    assert recorded_replicas(router_arm) == 2
    assert recorded_replicas({"command": ["vllm", "serve"], "toolserve_config": None}) == 1


def test_a_runs_error_names_a_misordered_ranking_and_the_largest_errors() -> None:
    def arm(system: str, measured: float, simulated: float) -> ArmComparison:
        return ArmComparison("run-a", system, measured, simulated, None, 0.5, None, 0.0)

    arms = [arm("stock", 100.0, 60.0), arm("toolserve", 80.0, 70.0)]
    ratios = [RatioComparison("run-a", "toolserve", "stock", 1.25, 60.0 / 70.0)]
    (error,) = run_errors(arms, ratios)
    assert not error.ranking_reproduced
    assert error.largest_ratio_error == pytest.approx(abs(60.0 / 70.0 / 1.25 - 1))
    assert error.largest_jct_error == pytest.approx(0.4)
    reordered = [arm("stock", 100.0, 90.0), arm("toolserve", 80.0, 70.0)]
    assert run_errors(reordered, [])[0].ranking_reproduced
    assert run_errors(reordered, [])[0].largest_ratio_error is None


VALIDATED_RUNS = (
    "trace-replay-default-7a1b96b",
    "trace-replay-tools-retention-pressed",
    "trace-replay-32-programs-drafted-998e093",
)
"""Recorded one-replica trace replays the simulator reproduces within the
tolerance docs/at-cluster-scale.md states (bench/results/sim-validation)."""


@pytest.mark.parametrize("run", VALIDATED_RUNS)
def test_a_recorded_run_is_simulated_within_the_stated_tolerance(run: str) -> None:
    """Every compared pair's mean-JCT ratio within 10% of the measured one, every
    arm's engine prefix-hit rate within 5 points of the measured one."""
    profile = StepProfile.load(REPO_ROOT / "bench" / "sim" / "profiles" / "smollm2-135m-cpu.json")
    arms, ratios = simulate_run(REPO_ROOT / "bench" / "results" / run, profile)
    assert arms and ratios
    for ratio in ratios:
        assert abs(ratio.error) <= 0.10, ratio
    for arm in arms:
        assert arm.measured_prefix_hit is not None
        assert abs(arm.simulated_prefix_hit - arm.measured_prefix_hit) <= 0.05, arm

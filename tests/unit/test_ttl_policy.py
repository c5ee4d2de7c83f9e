import math

import pytest

from cluster.policies.ttl_cost_model import (
    OffloadReload,
    PrefillProfile,
    TtlCostModel,
    best_ttl,
    displaced_share,
    empirical_cdf,
    holding_cost,
    memoryfulness,
    withheld_cache_share,
)


def model(**overrides: float | str) -> TtlCostModel:
    settings = {
        "fixed_ttl_s": 2.0,
        "max_ttl_s": 30.0,
        "min_tool_samples": 3,
        "sample_window": 100,
        "default_memoryfulness": 1.0,
    } | overrides
    return TtlCostModel(**settings)  # type: ignore[arg-type]


def test_empirical_cdf() -> None:
    samples = [1.0, 2.0, 2.0, 4.0]
    assert empirical_cdf(samples, 0.5) == 0
    assert empirical_cdf(samples, 2.0) == 0.75
    assert empirical_cdf(samples, 10) == 1
    assert empirical_cdf([], 1.0) == 0


def test_best_ttl_covers_the_fast_mode_when_the_slow_one_costs_more_than_it_saves() -> None:
    # Half the calls return in 1 s, half in 20 s; a return saves 10 s.
    # τ=1: 0.5*10-1 = 4; τ=20: 1*10-20 = -10; τ=0: 0.
    durations = [1.0] * 5 + [20.0] * 5
    assert best_ttl(durations, benefit_s=10, max_ttl_s=60) == 1.0


def test_best_ttl_waits_for_the_slow_mode_when_the_benefit_is_large() -> None:
    # τ=1: 0.5*100-1 = 49; τ=20: 100-20 = 80.
    durations = [1.0] * 5 + [20.0] * 5
    assert best_ttl(durations, benefit_s=100, max_ttl_s=60) == 20.0


def test_best_ttl_is_capped() -> None:
    durations = [1.0] * 5 + [20.0] * 5
    assert best_ttl(durations, benefit_s=100, max_ttl_s=10) == 1.0


def test_best_ttl_is_zero_when_every_tool_is_slower_than_its_benefit() -> None:
    assert best_ttl([5.0, 6.0, 7.0], benefit_s=4, max_ttl_s=60) == 0.0


def test_best_ttl_holds_longer_when_nobody_wants_the_memory() -> None:
    durations = [1.0] * 5 + [20.0] * 5
    # Full pressure: τ=1 gives 4, τ=20 gives -10. At 0.1: τ=1 gives 4.9, τ=20 gives 8.
    assert best_ttl(durations, benefit_s=10, max_ttl_s=60, holding_cost=1.0) == 1.0
    assert best_ttl(durations, benefit_s=10, max_ttl_s=60, holding_cost=0.1) == 20.0
    # Free memory: the cap, for returns slower than any seen yet.
    assert best_ttl(durations, benefit_s=10, max_ttl_s=60, holding_cost=0.0) == 60.0
    assert best_ttl([*durations, math.inf], benefit_s=10, max_ttl_s=60, holding_cost=0.0) == 60.0
    # Or a multiple of the longest return seen, within the cap.
    idle = {"benefit_s": 10, "max_ttl_s": 60, "holding_cost": 0.0}
    assert best_ttl(durations, **idle, idle_hold_factor=2.0) == 40.0
    assert best_ttl([*durations, math.inf], **idle, idle_hold_factor=2.0) == 40.0
    assert best_ttl(durations, **idle, idle_hold_factor=4.0) == 60.0
    # Nothing to gain, or nobody ever back within the cap: still no pin.
    assert best_ttl(durations, benefit_s=0, max_ttl_s=60, holding_cost=0.0) == 0.0
    assert best_ttl([math.inf, 90.0], benefit_s=10, max_ttl_s=60, holding_cost=0.0) == 0.0


def test_a_pin_costs_the_share_of_it_waiting_requests_need() -> None:
    assert displaced_share(free_blocks=100, waiting_blocks=0, own_blocks=10) == 0.0
    assert displaced_share(free_blocks=30, waiting_blocks=30, own_blocks=10) == 0.0
    assert displaced_share(free_blocks=30, waiting_blocks=35, own_blocks=10) == 0.5
    assert displaced_share(free_blocks=0, waiting_blocks=500, own_blocks=10) == 1.0
    assert displaced_share(free_blocks=0, waiting_blocks=500, own_blocks=0) == 0.0


def test_a_pin_withholds_its_share_of_the_evictable_cache() -> None:
    assert withheld_cache_share(free_blocks=90, own_blocks=10) == 0.1
    assert withheld_cache_share(free_blocks=10, own_blocks=10) == 0.5
    assert withheld_cache_share(free_blocks=0, own_blocks=10) == 1.0
    assert withheld_cache_share(free_blocks=10, own_blocks=0) == 0.0


def test_the_withheld_cache_is_charged_only_when_asked_and_never_below_demand() -> None:
    idle = {"free_blocks": 10, "waiting_blocks": 0, "own_blocks": 10}
    assert holding_cost(**idle, charge_withheld_cache=False) == 0.0
    assert holding_cost(**idle, charge_withheld_cache=True) == 0.5
    pressed = {"free_blocks": 10, "waiting_blocks": 40, "own_blocks": 10}
    assert holding_cost(**pressed, charge_withheld_cache=False) == 1.0
    assert holding_cost(**pressed, charge_withheld_cache=True) == 1.0


def test_charging_the_withheld_cache_ends_pins_at_the_slowest_return_seen() -> None:
    """Nobody waits: uncharged, a pin is held to the cap for returns slower than
    any seen; charged its share of a nearly full cache, it covers the returns
    worth their time and no more."""
    ttl_model = model()
    for duration in [1.0, 1.0, 1.0, 1.0, 3.0, math.inf]:
        ttl_model.observe_tool_duration("test", duration)
    ttl_model.observe_queueing_delay_without_kv(10.0)
    idle_pool = {"free_blocks": 20, "waiting_blocks": 0, "own_blocks": 20}
    uncharged = holding_cost(**idle_pool, charge_withheld_cache=False)
    charged = holding_cost(**idle_pool, charge_withheld_cache=True)
    assert ttl_model.ttl("test", 1000, holding_cost=uncharged) == 30.0
    assert ttl_model.ttl("test", 1000, holding_cost=charged) == 3.0


def test_on_idle_memory_a_fast_tool_is_pinned_for_its_own_returns_not_the_slowest_tools() -> None:
    """Nobody waits: priced by the tool being called, a file read's pin ends soon
    after the slowest read seen (or the fixed TTL), a test run's after the slowest
    run; priced from one distribution, every pin lasts as long as the slowest tool
    needs."""
    observed = {"read_file": [0.05, 0.1, 0.2], "run_tests": [8.0, 12.0, 9.0]}
    by_tool = model(idle_hold_factor=2.0)
    single = model(idle_hold_factor=2.0, durations_by="single")
    for ttl_model in (by_tool, single):
        for tool, durations in observed.items():
            for duration in durations:
                ttl_model.observe_tool_duration(tool, duration)
        ttl_model.observe_queueing_delay_without_kv(10.0)
    assert by_tool.ttl("read_file", 1000, holding_cost=0.0) == 2.0  # the fixed TTL's floor
    assert by_tool.ttl("run_tests", 1000, holding_cost=0.0) == 24.0
    assert single.ttl("read_file", 1000, holding_cost=0.0) == 24.0
    assert single.ttl("run_tests", 1000, holding_cost=0.0) == 24.0
    small_floor = model(idle_hold_factor=2.0, fixed_ttl_s=0.1)
    for duration in observed["read_file"]:
        small_floor.observe_tool_duration("read_file", duration)
    small_floor.observe_queueing_delay_without_kv(10.0)
    assert small_floor.ttl("read_file", 1000, holding_cost=0.0) == pytest.approx(0.4)


def test_cost_model_charges_the_holding_cost() -> None:
    ttl_model = model()
    for duration in [1.0, 1.0, 20.0, 20.0]:
        ttl_model.observe_tool_duration("build", duration)
    ttl_model.observe_queueing_delay_without_kv(10.0)
    assert ttl_model.ttl("build", 1000) == 1.0
    assert ttl_model.ttl("build", 1000, holding_cost=1.0) == 1.0
    assert ttl_model.ttl("build", 1000, holding_cost=0.2) == 20.0


def test_best_ttl_without_samples_is_zero() -> None:
    assert best_ttl([], benefit_s=100, max_ttl_s=60) == 0.0


def test_memoryfulness_of_equal_length_programs_is_one() -> None:
    assert memoryfulness([5, 5, 5, 5]) == pytest.approx(1.0)


# Lengths with a geometric distribution: turns done say nothing about turns left.
MEMORYLESS_PROGRAMS = [n for n in range(2, 14) for _ in range(2 ** (13 - n))]


def test_memoryfulness_of_geometric_lengths_is_near_zero() -> None:
    assert memoryfulness(MEMORYLESS_PROGRAMS) == pytest.approx(0.0, abs=0.05)
    assert memoryfulness([10, 11, 10, 12]) == pytest.approx(0.96, abs=0.01)


def test_memoryfulness_undefined_without_enough_turns() -> None:
    assert memoryfulness([]) is None
    assert memoryfulness([1, 1, 1]) is None
    assert memoryfulness([2]) is None


def test_prefill_profile_fits_a_quadratic() -> None:
    lengths = [256, 1024, 2048, 4096]
    seconds = [1e-7 * n * n + 1e-3 * n + 0.05 for n in lengths]
    profile = PrefillProfile.fit(lengths, seconds)
    assert profile.seconds(3000) == pytest.approx(1e-7 * 9e6 + 3 + 0.05, rel=1e-6)
    assert profile.seconds(0) == pytest.approx(0.05, abs=1e-6)
    with pytest.raises(ValueError):
        PrefillProfile.fit([1, 2], [0.1, 0.2])


def test_fixed_ttl_until_a_tool_has_enough_samples() -> None:
    ttl_model = model()
    assert ttl_model.ttl(None, 1000) == 2.0
    ttl_model.observe_tool_duration("search", 1.0)
    ttl_model.observe_tool_duration("search", 1.0)
    assert ttl_model.ttl("search", 1000) == 2.0
    # Unless holding the pin costs nothing: then as long as any pin may be held.
    assert ttl_model.ttl("search", 1000, holding_cost=0.0) == 30.0


def test_a_new_tool_is_judged_by_every_tool_until_it_has_samples_of_its_own() -> None:
    ttl_model = model()
    ttl_model.observe_queueing_delay_without_kv(10.0)
    for tool in ("ls", "cat", "grep"):
        ttl_model.observe_tool_duration(tool, 4.0)
    # Three returns in 4 s, none of them by `build`: that is the best guess.
    assert ttl_model.ttl("build", 1000) == 4.0
    for duration in [1.0, 1.0, 1.0]:
        ttl_model.observe_tool_duration("build", duration)
    assert ttl_model.ttl("build", 1000) == 1.0
    assert ttl_model.ttl(None, 1000) == 2.0  # the tool is not known yet


def test_cost_model_uses_queueing_delay_memoryfulness_and_prefill() -> None:
    ttl_model = model(sample_window=len(MEMORYLESS_PROGRAMS))
    for duration in [1.0, 1.0, 20.0, 20.0]:
        ttl_model.observe_tool_duration("build", duration)
    # No queueing delay, no profile: a return saves nothing, so do not pin.
    assert ttl_model.ttl("build", 1000) == 0.0
    ttl_model.observe_queueing_delay_without_kv(8.0)
    ttl_model.observe_queueing_delay_without_kv(12.0)
    # benefit = 10 * 1.0: τ=1 gives 4, τ=20 gives -10.
    assert ttl_model.ttl("build", 1000) == 1.0
    ttl_model.prefill_profile = PrefillProfile(0.0, 0.01, 0.0)
    # benefit = 10 + 0.01 * 10000 = 110: τ=20 gives 90, τ=1 gives 54.
    assert ttl_model.ttl("build", 10_000) == 20.0
    # Memoryless programs: the queueing delay no longer counts, only the prefill
    # of 100 tokens (1 s), which a 1-second wait at 50% cannot beat.
    assert ttl_model.ttl("build", 100) == 1.0
    for turns in MEMORYLESS_PROGRAMS:
        ttl_model.observe_program_completed(turns)
    assert ttl_model.ttl("build", 100) == 0.0


def test_a_cpu_tier_prices_a_lost_pin_at_its_reload_not_a_prefill() -> None:
    ttl_model = model(sample_window=4)
    for duration in [1.0, 1.0, 20.0, 20.0]:
        ttl_model.observe_tool_duration("build", duration)
    ttl_model.prefill_profile = PrefillProfile(0.0, 0.01, 0.0)
    # Prefill of 10,000 tokens: 100 s, worth holding for the slow returns.
    assert ttl_model.ttl("build", 10_000) == 20.0
    # 100 kB per token at 10 GB/s: 0.1 s, not worth any wait.
    ttl_model.offload_reload = OffloadReload(bytes_per_token=100_000, bytes_per_s=10e9)
    assert ttl_model.reload_s(10_000) == pytest.approx(0.1)
    assert ttl_model.ttl("build", 10_000) == 0.0


def test_fixed_mode_ignores_samples() -> None:
    ttl_model = TtlCostModel(
        fixed_ttl_s=3.0,
        max_ttl_s=30,
        min_tool_samples=1,
        sample_window=10,
        default_memoryfulness=1,
        use_cost_model=False,
    )
    ttl_model.observe_tool_duration("t", 0.1)
    assert ttl_model.ttl("t", 100) == 3.0


def test_fixed_ttl_never_exceeds_the_cap() -> None:
    assert model(fixed_ttl_s=50.0, max_ttl_s=10.0).ttl(None, 10) == 10.0


def test_sample_window_slides() -> None:
    ttl_model = model(sample_window=4, min_tool_samples=4)
    ttl_model.observe_queueing_delay_without_kv(100.0)
    for _ in range(4):
        ttl_model.observe_queueing_delay_without_kv(2.0)
    assert math.isclose(ttl_model.mean_queueing_delay_s, 2.0)


def test_a_pin_is_priced_by_the_tool_called_as_its_tenants_calls_took() -> None:
    """Tenant A's `search` returns in 1 s, tenant B's in 8 s: each tenant's pins
    follow its own; a tenant with too few falls back to the program's own
    returns, then the tool's across tenants, then every tool's."""
    ttl_model = model()
    ttl_model.observe_queueing_delay_without_kv(10.0)
    for _ in range(3):
        ttl_model.observe_tool_duration("search", 1.0, tenant="a", program_id="a/1")
        ttl_model.observe_tool_duration("search", 8.0, tenant="b", program_id="b/1")
    assert ttl_model.ttl("search", 1000, tenant="a") == 1.0
    assert ttl_model.ttl("search", 1000, tenant="b") == 8.0
    # Tenant c has none: its program's own returns (b/1's), else the tool's.
    assert ttl_model.ttl("search", 1000, tenant="c", program_id="b/1") == 8.0
    assert ttl_model.ttl("search", 1000, tenant="c", program_id="c/9") == 1.0
    # A tool nobody called: the program's returns, else every tool's together.
    assert ttl_model.ttl("build", 1000, tenant="a", program_id="a/1") == 1.0
    ttl_model.forget_program("a/1")
    assert ttl_model.ttl("build", 1000, tenant="a", program_id="a/1") == 1.0


def test_a_single_distribution_prices_every_pin_from_every_tools_returns() -> None:
    ttl_model = model(durations_by="single")
    ttl_model.observe_queueing_delay_without_kv(10.0)
    for _ in range(3):
        ttl_model.observe_tool_duration("read_file", 0.05, tenant="a")
    for _ in range(3):
        ttl_model.observe_tool_duration("run_tests", 20.0, tenant="a")
    # Half the returns in 50 ms: one TTL for both, whichever tool is running.
    assert ttl_model.ttl("read_file", 1000, tenant="a") == 0.05
    assert ttl_model.ttl("run_tests", 1000, tenant="a") == 0.05
    by_tool = model()
    by_tool.observe_queueing_delay_without_kv(10.0)
    for _ in range(3):
        by_tool.observe_tool_duration("run_tests", 20.0, tenant="a")
    # A 20 s test run is worth no pin when a return saves 10 s: 1·10 - 20 < 0.
    assert by_tool.ttl("run_tests", 1000, tenant="a") == 0.0
    for _ in range(3):
        by_tool.observe_tool_duration("read_file", 0.05, tenant="a")
    assert by_tool.ttl("read_file", 1000, tenant="a") == 0.05


def test_the_programs_own_returns_are_kept_for_the_programs_tracked() -> None:
    ttl_model = model(max_tracked_programs=2)
    for program in ("p1", "p2", "p3"):
        for _ in range(3):
            ttl_model.observe_tool_duration("x", 5.0, tenant=program, program_id=program)
    ttl_model.observe_queueing_delay_without_kv(10.0)
    # p1's returns were dropped for p3's: a tool it never called falls back to
    # every tool's (5 s all the same); kept programs answer from their own.
    assert ttl_model.ttl("y", 1000, tenant="z", program_id="p3") == 5.0
    assert "p1" not in ttl_model._program_durations

from cluster.policies.pinning_controller import NO_TOOL_CALL, LedgerChange, PinningController
from cluster.policies.tenancy import key_tenant
from cluster.policies.ttl_cost_model import RetentionHint, TtlCostModel


def controller(
    *,
    pinning_on: bool = True,
    total_blocks: int = 100,
    max_pinned_fraction: float = 0.5,
    max_tracked_programs: int = 100,
    fcfs_horizon_s: float | None = None,
    tenant_max_pinned_fraction: float | None = None,
) -> PinningController:
    return PinningController(
        TtlCostModel(
            fixed_ttl_s=2.0,
            max_ttl_s=30.0,
            min_tool_samples=2,
            sample_window=50,
            default_memoryfulness=1.0,
        ),
        pinning_on=pinning_on,
        total_blocks=total_blocks,
        max_pinned_fraction=max_pinned_fraction,
        max_tracked_programs=max_tracked_programs,
        fcfs_horizon_s=fcfs_horizon_s,
        tenant_max_pinned_fraction=tenant_max_pinned_fraction,
    )


def blocks(count: int, tag: str = "b") -> list[str]:
    return [f"{tag}{index}" for index in range(count)]


def finish_turn(
    pins: PinningController, program: str, now: float, count: int = 4, tool: str | None = "ls"
) -> bool:
    pinned, _ = pins.on_finished(program, blocks(count, program), count * 64, now, False)
    pins.on_turn_ended(program, tool, now)
    return pinned


def test_returning_turn_finds_its_pin_and_releases_it_on_admission() -> None:
    pins = controller()
    assert pins.on_arrival("a", 0.0) == 0.0
    assert finish_turn(pins, "a", 1.0)
    assert pins.pinned_blocks == 4
    assert pins.on_arrival("a", 1.5) == 0.0
    released = pins.on_admitted("a", 1.6, cached_tokens=256)
    assert [pin.program_id for pin in released] == ["a"]
    assert pins.pinned_blocks == 0
    stats = pins.take_stats()
    assert (stats.pins_created, stats.pin_hits, stats.returning_turns) == (1, 1, 1)
    assert stats.reused_prefix_tokens == 256
    assert stats.releases == {"next_turn": 1}
    assert stats.tool_durations_s == [("ls", 0.5)]
    assert stats.chosen_ttls_s == [2.0]


def test_pin_expires_at_its_ttl() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    finish_turn(pins, "a", 1.0)
    assert pins.expire(2.9) == []
    assert [pin.program_id for pin in pins.expire(3.0)] == ["a"]
    assert pins.take_stats().releases == {"expiry": 1}


def test_a_pin_whose_next_turn_waits_for_admission_outlives_its_ttl() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    finish_turn(pins, "a", 1.0)  # fixed TTL: expires at 3.0
    pins.on_arrival("a", 2.5)  # back in time, but the engine is busy
    assert pins.expire(10.0) == []
    assert [pin.program_id for pin in pins.relieve_pressure()] == ["a"]


def test_turn_without_tool_call_is_pinned_like_a_tool_of_its_own() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    assert finish_turn(pins, "a", 1.0, tool=None)
    assert [pin.tool for pin in pins.pins] == [NO_TOOL_CALL]
    assert pins.on_arrival("a", 1.5) == 0.0  # still ordered by its first arrival
    pins.on_admitted("a", 1.6, cached_tokens=256)
    stats = pins.take_stats()
    assert stats.pin_hits == 1 and stats.tool_durations_s == [(NO_TOOL_CALL, 0.5)]


def test_programs_that_never_come_back_teach_the_model_to_stop_pinning() -> None:
    pins = controller()  # max TTL 30 s, two samples needed
    for index, program in enumerate(["a", "b"]):
        start = index * 100.0
        pins.on_arrival(program, start)
        finish_turn(pins, program, start + 1.0, tool=None)
        assert pins.expire(start + 1.0 + 31.0) != []  # fixed 2 s TTL long over
    # Both counted as never back: an infinite duration each.
    assert pins.cost_model.ttl(NO_TOOL_CALL, 256) == 0.0
    pins.on_arrival("c", 300.0)
    finish_turn(pins, "c", 301.0, tool=None)
    assert pins.pins == []  # TTL 0: released as soon as the turn's kind was known


def test_a_report_arriving_after_the_next_turn_still_measures_the_gap() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    pins.on_finished("a", blocks(4), 256, 1.0, False)
    pins.on_arrival("a", 1.25)  # the client was faster than the replica's report
    pins.on_turn_ended("a", "ls", 1.3)
    pins.expire(100.0)  # long after: the program must not count as never back
    assert pins.take_stats().tool_durations_s == [("ls", 0.25)]
    assert pins.cost_model.ttl("ls", 256) == 2.0  # one sample: still the fixed TTL


def test_last_step_is_never_pinned() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    pinned, released = pins.on_finished("a", blocks(4), 256, 1.0, last_step=True)
    assert not pinned and released == []
    assert pins.pinned_blocks == 0


def test_pinning_off_pins_nothing_but_still_learns_arrivals() -> None:
    pins = controller(pinning_on=False)
    assert pins.on_arrival("a", 5.0) == 5.0
    assert not finish_turn(pins, "a", 6.0)
    assert pins.on_arrival("a", 7.0) == 5.0


def test_program_fcfs_keeps_the_first_arrival() -> None:
    pins = controller()
    pins.on_arrival("old", 1.0)
    pins.on_arrival("new", 2.0)
    finish_turn(pins, "old", 3.0)
    assert pins.on_arrival("old", 4.0) == 1.0


def test_a_turn_queues_at_its_programs_first_arrival_without_a_horizon() -> None:
    pins = controller()
    pins.on_arrival("old", 1.0)
    pins.on_arrival("old", 500.0)
    assert pins.queue_time("old", 500.0) == 1.0
    assert pins.queue_time("unknown", 7.0) == 7.0


def test_a_horizon_bounds_how_far_ahead_an_old_programs_turn_queues() -> None:
    pins = controller(fcfs_horizon_s=60.0)
    pins.on_arrival("old", 1.0)
    pins.on_arrival("old", 40.0)
    assert pins.queue_time("old", 40.0) == 1.0  # within the horizon: its first arrival
    pins.on_arrival("new", 100.0)
    pins.on_arrival("old", 130.0)
    old_turn = pins.queue_time("old", 130.0)
    assert old_turn == 70.0
    # The newcomer still waits behind the old program's turns that arrive within
    # the horizon after it, and no longer behind later ones.
    assert old_turn < pins.queue_time("new", 100.0)
    assert pins.queue_time("old", 170.0) > pins.queue_time("new", 100.0)


def test_a_forked_program_queues_in_its_parents_place() -> None:
    pins = controller(fcfs_horizon_s=60.0)
    pins.on_arrival("parent", 10.0)
    pins.on_arrival("child", 30.0, parent_id="parent")
    assert pins.queue_time("child", 30.0) == 10.0


def test_pressure_releases_the_latest_arrived_program_first() -> None:
    pins = controller()
    for arrival, program in enumerate(["first", "second", "third"]):
        pins.on_arrival(program, float(arrival))
    for program in ["third", "first", "second"]:
        finish_turn(pins, program, 10.0)
    assert [pin.program_id for pin in pins.relieve_pressure()] == ["third"]
    assert [pin.program_id for pin in pins.relieve_pressure()] == ["second"]
    assert pins.take_stats().releases == {"pressure": 2}


def test_a_waiting_turn_releases_only_pins_of_programs_that_arrived_after_it() -> None:
    pins = controller()
    for arrival, program in enumerate(["first", "second", "third"]):
        pins.on_arrival(program, float(arrival))
        finish_turn(pins, program, 10.0)
    released = [pin.program_id for pin in pins.relieve_pressure(queued_after=1.0)]
    assert released == ["third"]
    assert pins.relieve_pressure(queued_after=1.0) == []
    assert pins.first_arrival("second") == 1.0
    assert {pin.program_id for pin in pins.pins} == {"first", "second"}


def test_repricing_under_new_pressure_shortens_pins_and_ends_those_past_due() -> None:
    pins = controller()
    for _ in range(2):
        pins.cost_model.observe_tool_duration("ls", 5.0)
    pins.cost_model.observe_queueing_delay_without_kv(20.0)
    for arrival, program in enumerate(["cheap", "dear", "unreported", "back"]):
        pins.on_arrival(program, float(arrival))
        pins.on_finished(program, blocks(4, program), 256, 10.0, False)
        if program != "unreported":
            pins.on_turn_ended(program, "ls", 10.0, holding_cost=0.0)
    # Nobody waits: the longest TTL; the unreported turn keeps the fixed one.
    expiries = {pin.program_id: pin.expires_at for pin in pins.pins}
    assert expiries == {"cheap": 40.0, "dear": 40.0, "unreported": 12.0, "back": 40.0}
    pins.on_arrival("back", 11.0)
    pins.take_ledger_changes()

    costs = {"cheap": 1.0, "dear": 5.0, "unreported": 5.0, "back": 5.0}
    released = pins.reprice(12.0, costs)

    # cheap: 1.0 * 20 s saved - 5 s held pays at TTL 5 s; dear: holding 5 s costs 25 s.
    assert [pin.program_id for pin in released] == ["dear"]
    expiries = {pin.program_id: pin.expires_at for pin in pins.pins}
    assert expiries == {"cheap": 15.0, "unreported": 12.0, "back": 40.0}
    assert pins.take_ledger_changes() == [
        LedgerChange("cheap", 15.0, 256, "ls"),
        LedgerChange("dear", None),
    ]
    assert pins.take_stats().releases == {"repriced": 1}


def test_cap_displaces_later_programs_and_refuses_when_only_earlier_ones_pin() -> None:
    pins = controller(total_blocks=20, max_pinned_fraction=0.5)  # 10 blocks for pins
    pins.on_arrival("early", 0.0)
    pins.on_arrival("late", 1.0)
    pins.on_arrival("later", 2.0)
    assert finish_turn(pins, "late", 3.0, count=6)
    pinned, released = pins.on_finished("early", blocks(6, "e"), 384, 4.0, False)
    assert pinned and [pin.program_id for pin in released] == ["late"]
    pinned, released = pins.on_finished("later", blocks(6, "l"), 384, 5.0, False)
    assert not pinned and released == []
    assert pins.pinned_blocks == 6


def test_cost_model_ttl_after_enough_tool_samples() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    for turn in range(3):
        finish_turn(pins, "a", 10.0 * turn, tool="build")
        pins.on_arrival("a", 10.0 * turn + 5.0)
        pins.on_admitted("a", 10.0 * turn + 5.0, 0)
    pins.cost_model.observe_queueing_delay_without_kv(20.0)
    finish_turn(pins, "a", 100.0, tool="build")
    # Every build took 5 s and a return saves 20 s: pin for exactly 5 s.
    assert pins.pins[0].expires_at == 105.0


def test_the_holding_cost_at_turn_end_sets_the_ttl() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    for turn, gap in enumerate([1.0, 1.0, 20.0, 20.0]):
        finish_turn(pins, "a", 100.0 * turn, tool="build")
        pins.on_arrival("a", 100.0 * turn + gap)
        pins.on_admitted("a", 100.0 * turn + gap, 0)
    # The two slow returns found no pin and waited 0 s: with 30 s, a mean of 10 s.
    pins.cost_model.observe_queueing_delay_without_kv(30.0)
    assert pins.cost_model.mean_queueing_delay_s == 10.0
    pins.on_finished("a", blocks(4, "a"), 256, 1000.0, False)
    assert pins.pinned_blocks_of("a") == 4
    pins.on_turn_ended("a", "build", 1000.0, holding_cost=1.0)
    assert pins.pins[0].expires_at == 1001.0  # half come back in 1 s; 20 s costs more
    pins.on_arrival("a", 1000.5)
    pins.on_admitted("a", 1000.5, 0)
    pins.on_finished("a", blocks(4, "a"), 256, 2000.0, False)
    pins.on_turn_ended("a", "build", 2000.0, holding_cost=0.1)
    assert pins.pins[0].expires_at == 2020.0  # memory to spare: wait for the slow half
    assert pins.take_stats().holding_costs == [1.0, 1.0, 1.0, 1.0, 1.0, 0.1]


def test_queueing_delay_is_learned_from_returning_turns_that_lost_their_kv() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    finish_turn(pins, "a", 1.0)
    pins.expire(10.0)
    pins.on_arrival("a", 11.0)
    pins.on_admitted("a", 14.0, 0)
    assert pins.cost_model.mean_queueing_delay_s == 3.0
    assert pins.take_stats().pin_hits == 0


def test_a_moved_program_loses_its_pin_but_records_no_program_length() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    finish_turn(pins, "a", 1.0)
    memoryfulness = pins.cost_model.memoryfulness
    assert [pin.program_id for pin in pins.release_moved("a")] == ["a"]
    assert pins.pinned_blocks == 0 and pins.release_moved("a") == []
    assert pins.take_stats().releases == {"moved": 1}
    assert pins.cost_model.memoryfulness == memoryfulness
    assert pins.on_arrival("a", 5.0) == 0.0


def test_program_end_records_its_length_for_memoryfulness() -> None:
    pins = controller()
    for program, turns in [("a", 3), ("b", 5)]:
        for _ in range(turns):
            pins.on_arrival(program, 0.0)
        pins.end_program(program)
    assert pins.cost_model.memoryfulness < 1.0


def test_ledger_sees_every_pin_and_its_release() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    finish_turn(pins, "a", 1.0)
    pins.end_program("a")
    assert pins.take_ledger_changes() == [
        LedgerChange("a", 3.0, 256),
        LedgerChange("a", 3.0, 256, "ls"),
        LedgerChange("a", None),
    ]
    assert pins.take_ledger_changes() == []


def test_release_all_leaves_nothing_pinned() -> None:
    pins = controller()
    for program in "abc":
        pins.on_arrival(program, 0.0)
        finish_turn(pins, program, 1.0)
    assert len(pins.release_all()) == 3
    assert pins.pinned_blocks == 0 and pins.pins == []


def test_tracked_programs_are_bounded() -> None:
    pins = controller(max_tracked_programs=3)
    for index in range(10):
        pins.on_arrival(f"p{index}", float(index))
    assert pins.on_arrival("p0", 20.0) == 20.0
    assert pins.on_arrival("p9", 21.0) == 9.0


def test_a_retain_for_hint_sets_the_ttl_up_to_the_longest_and_outlasts_repricing() -> None:
    pins = controller()
    for program, retain_for_s in [("short", 12.0), ("long", 600.0)]:
        pins.on_arrival(program, 0.0)
        hint = RetentionHint(retain_for_s=retain_for_s)
        pins.on_finished(program, blocks(4, program), 256, 10.0, False, hint)
        pins.on_turn_ended(program, "ls", 10.0, holding_cost=1.0)
    assert {pin.program_id: pin.expires_at for pin in pins.pins} == {"short": 22.0, "long": 40.0}
    assert pins.reprice(11.0, {"short": 5.0, "long": 5.0}) == []


def test_an_expected_tool_duration_prices_the_pin_before_any_sample() -> None:
    pins = controller()
    pins.cost_model.observe_queueing_delay_without_kv(20.0)
    pins.on_arrival("hinted", 0.0)
    pins.on_arrival("plain", 0.0)
    pins.on_finished("hinted", blocks(4, "h"), 256, 10.0, False, RetentionHint(expected_tool_s=7.0))
    pins.on_turn_ended("hinted", "build", 10.0, holding_cost=1.0)
    finish_turn(pins, "plain", 10.0, tool="build")
    # A 7 s return saves 20 s for 7 s held; with no sample the fixed 2 s.
    assert {pin.program_id: pin.expires_at for pin in pins.pins} == {"hinted": 17.0, "plain": 12.0}
    pins.on_finished("dear", blocks(4, "d"), 256, 10.0, False, RetentionHint(expected_tool_s=25.0))
    assert pins.on_turn_ended("dear", "build", 10.0, holding_cost=1.0)[0].program_id == "dear"


def test_pressure_releases_the_least_important_program_before_the_latest() -> None:
    pins = controller()
    for arrival, (program, priority) in enumerate(
        [("background", 5), ("urgent", -5), ("normal", 0)]
    ):
        pins.on_arrival(program, float(arrival))
        pins.on_finished(program, blocks(4, program), 256, 10.0, False, priority=priority)
    order = [pin.program_id for _ in range(3) for pin in pins.relieve_pressure()]
    assert order == ["background", "normal", "urgent"]
    # A waiting turn still frees only pins of programs that arrived after it.
    for program, priority in [("background", 5), ("urgent", -5)]:
        pins.on_finished(program, blocks(4, program), 256, 20.0, False, priority=priority)
    assert [pin.program_id for pin in pins.relieve_pressure(queued_after=0.5)] == ["urgent"]


def test_a_fork_holds_its_parents_place_and_lets_go_before_it() -> None:
    pins = controller()
    pins.on_arrival("parent", 0.0)
    pins.on_arrival("later", 5.0)
    assert pins.on_arrival("child", 10.0, parent_id="parent") == 0.0
    assert pins.on_arrival("orphan", 11.0, parent_id="unknown") == 11.0
    for program in ["parent", "later", "child"]:
        finish_turn(pins, program, 20.0)
    # The child's waiting turn frees only programs that arrived after its parent.
    assert [pin.program_id for pin in pins.relieve_pressure(queued_after=0.0)] == ["later"]
    assert pins.relieve_pressure(queued_after=0.0) == []
    assert [pin.program_id for pin in pins.relieve_pressure()] == ["child"]
    assert [pin.program_id for pin in pins.relieve_pressure()] == ["parent"]


def test_a_tenant_holds_no_more_than_its_share_of_the_pins() -> None:
    """Tenant A's programs pin up to its share (20 of 100 blocks), as the global
    cap does: an earlier program's pin displaces A's later programs' pins, a later
    program's is not made; tenant B's pin is untouched by A's."""
    from cluster.policies.tenancy import key_tenant, scoped_program_id

    tenant_a, tenant_b = key_tenant("a" * 64), key_tenant("b" * 64)
    pins = controller(total_blocks=100, tenant_max_pinned_fraction=0.2)
    programs = [scoped_program_id(tenant_a, f"p{index}") for index in range(4)]
    other = scoped_program_id(tenant_b, "p0")
    for arrival, program in enumerate([other, *programs]):
        pins.on_arrival(program, float(arrival))
    assert finish_turn(pins, other, 10.0, count=16)
    assert finish_turn(pins, programs[1], 10.0, count=8)
    assert finish_turn(pins, programs[2], 10.0, count=8)
    assert finish_turn(pins, programs[0], 11.0, count=8)  # A's latest pin lets go
    assert {pin.program_id for pin in pins.pins} == {other, programs[0], programs[1]}
    assert pins.take_stats().releases == {"tenant_share": 1}
    assert not finish_turn(pins, programs[3], 12.0, count=8)  # nothing later of A to let go
    assert pins.pinned_blocks_of(other) == 16


def test_with_a_horizon_a_waiting_turn_may_take_an_old_programs_pin() -> None:
    """An old program's next turn would queue no earlier than the horizon before
    now: a newer program's turn that has waited longer than that comes first, so
    the old program's pin may go for it; without the horizon it may not."""
    for horizon, released in ((None, []), (60.0, ["old"])):
        pins = controller(fcfs_horizon_s=horizon)
        pins.on_arrival("old", 0.0)
        finish_turn(pins, "old", 200.0)
        # A new program's turn queued at 100; the old program's next turn, if it
        # came now (at 200), would queue at 140 with the horizon, at 0 without.
        relieved = pins.relieve_pressure(queued_after=100.0, now=200.0)
        assert [pin.program_id for pin in relieved] == released


def test_pinned_token_seconds_are_used_when_the_program_came_back_else_wasted() -> None:
    pins = controller()
    pins.on_arrival("a", 0.0)
    pins.on_arrival("b", 0.0)
    finish_turn(pins, "a", 1.0)  # 256 tokens
    finish_turn(pins, "b", 1.0, count=2)  # 128 tokens
    pins.on_arrival("a", 1.5)
    pins.on_admitted("a", 1.5, cached_tokens=256)
    assert [pin.program_id for pin in pins.expire(3.0)] == ["b"]
    finish_turn(pins, "a", 4.0)
    pins.end_program("a", 5.0)
    pins.on_arrival("c", 6.0)
    finish_turn(pins, "c", 6.0)
    pins.release_moved("c")  # untimed: not counted
    stats = pins.take_stats()
    assert stats.pinned_token_seconds == {"used": 256 * 0.5, "wasted": 128 * 2.0 + 256 * 1.0}
    assert pins.take_stats().pinned_token_seconds == stats.pinned_token_seconds, "cumulative"
    assert stats.as_dict()["pinned_token_seconds"] == dict(stats.pinned_token_seconds)


def test_each_tenants_returns_price_its_own_pins() -> None:
    """Program ids carry their tenant: tenant A's `search` comes back in 1 s,
    tenant B's in 10 s, and each one's pins of it last accordingly."""
    pins = controller()
    pins.cost_model.observe_queueing_delay_without_kv(20.0)
    tenant_a, tenant_b = key_tenant("a" * 24), key_tenant("b" * 24)
    for index in range(2):
        for tenant, gap in ((tenant_a, 1.0), (tenant_b, 10.0)):
            program = f"{tenant}/p{index}"
            pins.on_arrival(program, 0.0)
            finish_turn(pins, program, 1.0, tool="search")
            pins.on_arrival(program, 1.0 + gap)
            pins.on_admitted(program, 1.0 + gap, cached_tokens=0)
    for tenant, ttl in ((tenant_a, 1.0), (tenant_b, 10.0)):
        program = f"{tenant}/new"
        pins.on_arrival(program, 50.0)
        finish_turn(pins, program, 51.0, tool="search")
        (pin,) = [pin for pin in pins.pins if pin.program_id == program]
        assert pin.expires_at == 51.0 + ttl, tenant

"""The replica choice: pins, stickiness, placement by prefix (joining or spreading),
bounded-load hashing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.policy import (
    HashRing,
    ProgramDirectory,
    ProgramView,
    RoutingPolicy,
    RoutingReason,
    load_capacity,
)
from router.prefix import shared_prefix_key

EPSILON = 0.25
AFFINITY_FACTOR = 1.5


def _policy(affinity_free_slots: int = 0, spread_prefixes: bool = False) -> RoutingPolicy:
    return RoutingPolicy(
        load_epsilon=EPSILON,
        affinity_load_factor=AFFINITY_FACTOR,
        virtual_nodes=64,
        affinity_free_slots=affinity_free_slots,
        spread_prefixes=spread_prefixes,
    )


def _ring_owner(program_id: str, replicas: list[str]) -> str:
    return HashRing(frozenset(replicas), 64).walk(program_id)[0]


def test_a_pinned_program_goes_to_its_pin_even_against_the_ring() -> None:
    loads = {"a": 1, "b": 1}
    program = "p-1"
    other = "b" if _ring_owner(program, list(loads)) == "a" else "a"
    decision = _policy().choose(ProgramView(program, pinned_replica=other), loads)
    assert decision.replica_id == other and decision.reason is RoutingReason.PINNED
    assert decision.stale_pin_replica is None


def test_an_overloaded_pin_owner_is_passed_over_and_its_pin_called_stale() -> None:
    loads = {"a": 9, "b": 0}
    decision = _policy().choose(ProgramView("p", pinned_replica="a"), loads)
    assert decision.replica_id == "b"
    assert decision.reason is RoutingReason.FALLBACK and decision.stale_pin_replica == "a"


def test_a_pin_owner_with_free_engine_slots_keeps_the_program_however_uneven() -> None:
    policy = _policy(affinity_free_slots=16)
    kept = policy.choose(ProgramView("p", pinned_replica="a"), {"a": 15, "b": 0})
    assert kept.replica_id == "a" and kept.reason is RoutingReason.PINNED
    sticky = policy.choose(ProgramView("p", previous_replica="a"), {"a": 15, "b": 0})
    assert sticky.replica_id == "a" and sticky.reason is RoutingReason.STICKY
    full = policy.choose(ProgramView("p", pinned_replica="a"), {"a": 16, "b": 0})
    assert full.replica_id == "b" and full.stale_pin_replica == "a"
    # Free slots never place a new program: it is hashed within the tight bound.
    new = policy.choose(ProgramView("q", prefix_replicas={"a": 3}), {"a": 15, "b": 0})
    assert new.replica_id == "b"


def test_a_replica_left_with_far_more_live_programs_gives_up_its_returning_ones() -> None:
    policy = _policy(affinity_free_slots=32)
    idle = {"a": 0, "b": 0}
    # 10 live programs against 2: above ceil(1.5 x 6) = 9, free slots or not.
    moved = policy.choose(ProgramView("p", pinned_replica="a"), idle, {"a": 10, "b": 2})
    assert moved.replica_id == "b" and moved.reason is RoutingReason.FALLBACK
    assert moved.stale_pin_replica == "a"
    unpinned = policy.choose(ProgramView("p", previous_replica="a"), idle, {"a": 10, "b": 2})
    assert unpinned.replica_id == "b" and unpinned.reason is RoutingReason.FALLBACK
    # 9 against 3 is uneven but within the bound: a move's prefill is not worth it.
    kept = policy.choose(ProgramView("p", pinned_replica="a"), idle, {"a": 9, "b": 3})
    assert kept.replica_id == "a" and kept.reason is RoutingReason.PINNED
    # One replica is never crowded.
    alone = policy.choose(ProgramView("p", pinned_replica="a"), {"a": 0}, {"a": 12})
    assert alone.replica_id == "a"


def test_a_pin_on_a_dead_replica_is_stale() -> None:
    decision = _policy().choose(ProgramView("p", pinned_replica="gone"), {"a": 0, "b": 0})
    assert decision.reason is RoutingReason.FALLBACK and decision.stale_pin_replica == "gone"
    assert decision.replica_id in {"a", "b"}


def test_a_returning_program_without_a_pin_stays_on_its_replica() -> None:
    program = "p-7"
    other = "b" if _ring_owner(program, ["a", "b"]) == "a" else "a"
    view = ProgramView(program, previous_replica=other)
    decision = _policy().choose(view, {"a": 1, "b": 1})
    assert decision.replica_id == other and decision.reason is RoutingReason.STICKY
    # Far busier than the mean: the program moves (its KV was not pinned anyway).
    busy = {other: 8, "a" if other == "b" else "b": 0}
    moved = _policy().choose(view, busy)
    assert moved.replica_id != other and moved.reason is RoutingReason.FALLBACK
    assert moved.stale_pin_replica is None


def test_a_new_program_joins_the_least_loaded_replica_holding_its_prefix() -> None:
    view = ProgramView("new", prefix_replicas={"b": 5, "c": 1})
    decision = _policy().choose(view, {"a": 0, "b": 2, "c": 1})
    assert decision.replica_id == "c" and decision.reason is RoutingReason.PREFIX


def test_prefix_affinity_yields_to_the_load_bound() -> None:
    loads = {"a": 0, "b": 3}  # capacity ceil(1.25 * 4 / 2) = 3: b is full
    decision = _policy().choose(ProgramView("new", prefix_replicas={"b": 4}), loads)
    assert decision.replica_id == "a" and decision.reason is RoutingReason.HASHED


def test_spreading_sends_a_new_program_where_the_fewest_of_its_prefix_went() -> None:
    spread = _policy(spread_prefixes=True)
    view = ProgramView("new", prefix_replicas={"a": 2, "b": 1})
    live = {"a": 1, "b": 1, "c": 1}
    decision = spread.choose(view, {"a": 0, "b": 0, "c": 0}, live_programs=live)
    assert decision.replica_id == "c" and decision.reason is RoutingReason.PREFIX
    joined = _policy().choose(view, {"a": 0, "b": 0, "c": 0}, live_programs=live)
    assert joined.replica_id == "a" and joined.reason is RoutingReason.PREFIX
    # As many of the prefix on each: the fewest live programs, then in flight.
    even = ProgramView("new", prefix_replicas={"a": 1, "b": 1})
    decision = spread.choose(even, {"a": 0, "b": 1}, live_programs={"a": 2, "b": 1})
    assert decision.replica_id == "b"
    decision = spread.choose(even, {"a": 0, "b": 1}, live_programs={"a": 1, "b": 1})
    assert decision.replica_id == "a"
    # Within the load bound (capacity ceil(1.25 x 4 / 2) = 3: "a" is full).
    decision = spread.choose(ProgramView("new", prefix_replicas={"b": 4}), {"a": 3, "b": 0})
    assert decision.replica_id == "b" and decision.reason is RoutingReason.PREFIX


@pytest.mark.parametrize(("spread", "coders_on_each"), [(False, [0, 4]), (True, [2, 2])])
def test_two_kinds_of_program_share_the_replicas_alike_only_when_spread(
    spread: bool, coders_on_each: list[int]
) -> None:
    # A recorded two-replica run's arrivals: short assistants and long coders,
    # each kind with a prompt prefix of its own, all still live when the last comes.
    policy = _policy(spread_prefixes=spread)
    directory = ProgramDirectory(max_programs=100, max_prefixes=10, live_after_turn_s=300.0)
    arrivals = [("a1", "assistant"), ("a2", "assistant"), ("c1", "coder"), ("c2", "coder")]
    arrivals += [("c3", "coder"), ("a3", "assistant"), ("c4", "coder")]
    placed = {}
    for now, (program, kind) in enumerate(arrivals):
        live = directory.live_programs(now=float(now))
        view = directory.view(program, kind, None)
        placed[program] = policy.choose(view, {"r1": 0, "r2": 0}, live).replica_id
        directory.routed(program, kind, placed[program], now=float(now))
        directory.turn_ended(program, now=float(now))
    coders = [program for program, kind in arrivals if kind == "coder"]
    on_each = [sum(placed[c] == replica for c in coders) for replica in ("r1", "r2")]
    assert sorted(on_each) == coders_on_each


def test_a_new_program_without_prefix_owners_is_hashed() -> None:
    loads = {"a": 0, "b": 0, "c": 0}
    decision = _policy().choose(ProgramView("q"), loads)
    assert decision.reason is RoutingReason.HASHED
    assert decision.replica_id == _ring_owner("q", list(loads))


def test_no_replica_and_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError):
        _policy().choose(ProgramView("p"), {})
    with pytest.raises(ValueError):
        RoutingPolicy(load_epsilon=0, affinity_load_factor=2, virtual_nodes=8)
    with pytest.raises(ValueError):
        RoutingPolicy(load_epsilon=0.5, affinity_load_factor=1.2, virtual_nodes=8)


replica_names = st.sampled_from([f"r{i}" for i in range(8)])
load_maps = st.dictionaries(replica_names, st.integers(0, 30), min_size=1, max_size=8)
views = st.builds(
    ProgramView,
    program_id=st.text(min_size=1, max_size=12),
    pinned_replica=st.none() | replica_names,
    previous_replica=st.none() | replica_names,
    prefix_replicas=st.dictionaries(replica_names, st.integers(1, 5), max_size=4),
)


@given(
    view=views,
    loads=load_maps,
    free_slots=st.integers(0, 40),
    live=st.dictionaries(replica_names, st.integers(0, 30), max_size=8),
    spread=st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_every_choice_respects_its_load_bound(
    view: ProgramView, loads: dict[str, int], free_slots: int, live: dict[str, int], spread: bool
) -> None:
    decision = _policy(free_slots, spread).choose(view, loads, live)
    assert decision.replica_id in loads
    if decision.reason in (RoutingReason.PINNED, RoutingReason.STICKY):
        bound = max(load_capacity(loads, AFFINITY_FACTOR), free_slots)
        live_counts = [live.get(replica_id, 0) for replica_id in loads]
        crowded_above = math.ceil(AFFINITY_FACTOR * sum(live_counts) / len(live_counts))
        assert live.get(decision.replica_id, 0) <= crowded_above
    else:
        bound = load_capacity(loads, 1 + EPSILON)
    assert loads[decision.replica_id] + 1 <= bound


@given(
    replicas=st.lists(replica_names, min_size=1, max_size=8, unique=True),
    programs=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=60),
)
@settings(max_examples=150, deadline=None)
def test_routing_a_stream_never_exceeds_the_bound(replicas: list[str], programs: list[str]) -> None:
    policy = _policy()
    directory = ProgramDirectory(max_programs=1000, max_prefixes=10, live_after_turn_s=30.0)
    loads = dict.fromkeys(replicas, 0)
    for program in programs:
        decision = policy.choose(directory.view(program, "shared", None), loads)
        factor = AFFINITY_FACTOR if decision.reason is RoutingReason.STICKY else 1 + EPSILON
        assert loads[decision.replica_id] + 1 <= load_capacity(loads, factor)
        loads[decision.replica_id] += 1
        directory.routed(program, "shared", decision.replica_id, now=0.0)


@given(
    replicas=st.lists(replica_names, min_size=2, max_size=8, unique=True),
    programs=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=40, unique=True),
)
@settings(max_examples=150, deadline=None)
def test_replicas_coming_and_going_move_only_their_own_programs(
    replicas: list[str], programs: list[str]
) -> None:
    policy = _policy()
    idle = dict.fromkeys(replicas, 0)
    before = {p: policy.choose(ProgramView(p), idle).replica_id for p in programs}
    leaving = replicas[0]
    fewer = {r: 0 for r in replicas if r != leaving}
    after = {p: policy.choose(ProgramView(p), fewer).replica_id for p in programs}
    for program in programs:
        if before[program] != leaving:
            assert after[program] == before[program]
    # Coming back: programs return to where they were, the others stay.
    again = {p: policy.choose(ProgramView(p), idle).replica_id for p in programs}
    assert again == before


def test_directory_remembers_last_replicas_and_prefix_owners_within_bounds() -> None:
    directory = ProgramDirectory(max_programs=2, max_prefixes=1, live_after_turn_s=30.0)
    directory.routed("p1", "k", "a", now=0.0)
    directory.routed("p1", "k", "b", now=1.0)  # a returning turn does not count its prefix again
    directory.routed("p2", "k", "a", now=2.0)
    assert directory.view("p1", "k", None) == ProgramView("p1", None, "b", {"a": 2})
    directory.routed("p3", "other", "c", now=3.0)  # evicts p1 (oldest) and prefix "k"
    assert directory.view("p1", "k", None).previous_replica is None
    assert directory.view("p1", "k", None).prefix_replicas == {}
    directory.forget_replica("c")
    assert directory.view("p3", "other", "c") == ProgramView("p3", "c", None, {})
    directory.forget_program("p2")
    assert directory.view("p2", None, None).previous_replica is None
    assert directory.live_programs(now=3.0) == {}


def test_a_program_is_live_while_a_turn_runs_and_while_its_tool_runs_after() -> None:
    directory = ProgramDirectory(max_programs=100, max_prefixes=10, live_after_turn_s=30.0)
    directory.routed("long-turn", None, "a", now=0.0)
    directory.routed("in-tool", None, "a", now=0.0)
    directory.turn_ended("in-tool", now=10.0)
    directory.routed("finished", None, "b", now=0.0)
    directory.turn_ended("finished", now=5.0)
    assert directory.live_programs(now=20.0) == {"a": 2, "b": 1}
    # 100 s later: the long turn is still in flight; the others went quiet.
    assert directory.live_programs(now=100.0) == {"a": 1}
    directory.turn_ended("long-turn", now=100.0)
    directory.routed("in-tool", None, "a", now=100.0)
    directory.routed("in-tool", None, "a", now=101.0, new_turn=False)  # re-routed, same turn
    assert directory.live_programs(now=120.0) == {"a": 2}
    directory.turn_ended("in-tool", now=200.0)
    assert directory.live_programs(now=200.0) == {"a": 1}
    assert directory.live_programs(now=231.0) == {}
    directory.forget_replica("a")
    assert directory.live_programs(now=200.0) == {}


def test_new_programs_spread_by_live_programs_when_none_is_in_flight() -> None:
    # Every program on "a" is away running a tool: in flight both replicas look idle.
    idle = {"a": 0, "b": 0}
    prefix_on_a = ProgramView("new", prefix_replicas={"a": 3})
    decision = _policy().choose(prefix_on_a, idle, live_programs={"a": 3})
    assert decision.replica_id == "b" and decision.reason is RoutingReason.HASHED
    owners_of_both = ProgramView("new", prefix_replicas={"a": 3, "b": 1})
    decision = _policy().choose(owners_of_both, idle, live_programs={"a": 3, "b": 2})
    assert decision.replica_id == "b" and decision.reason is RoutingReason.PREFIX
    # Returning programs are not placed: they stay where their KV is, on a replica
    # no new program would join (6 live, placement bound ceil(1.25 x 4.5) = 6).
    back = _policy().choose(ProgramView("p", previous_replica="a"), idle, {"a": 6, "b": 2})
    assert back.replica_id == "a" and back.reason is RoutingReason.STICKY


@given(
    replicas=st.lists(replica_names, min_size=1, max_size=8, unique=True),
    arrivals=st.integers(1, 80),
)
@settings(max_examples=150, deadline=None)
def test_placing_programs_that_are_all_away_keeps_live_programs_within_the_bound(
    replicas: list[str], arrivals: int
) -> None:
    policy = _policy()
    directory = ProgramDirectory(max_programs=1000, max_prefixes=10, live_after_turn_s=30.0)
    idle = dict.fromkeys(replicas, 0)
    for index in range(arrivals):
        program = f"p{index}"
        live = directory.live_programs(now=float(index))
        decision = policy.choose(directory.view(program, "shared", None), idle, live)
        assert live[decision.replica_id] + 1 <= load_capacity(
            {r: live[r] for r in replicas}, 1 + EPSILON
        )
        directory.routed(program, "shared", decision.replica_id, now=float(index))
        directory.turn_ended(program, now=float(index))


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 10}


def test_shared_prefix_is_instructions_and_tools() -> None:
    first = [SYSTEM, {"role": "user", "content": "fix bug 1"}]
    second = [SYSTEM, {"role": "user", "content": "fix bug 2"}]
    key = shared_prefix_key(first, TOOLS, min_chars=100)
    assert key is not None and key == shared_prefix_key(second, TOOLS, min_chars=100)
    reordered_tools = [{"function": {"parameters": {"type": "object"}, "name": "read_file"},
                        "type": "function"}]  # fmt: skip
    assert shared_prefix_key(second, reordered_tools, min_chars=100) == key
    other_tools = [{"type": "function", "function": {"name": "search"}}]
    assert shared_prefix_key(first, other_tools, min_chars=100) != key
    assert shared_prefix_key(first, TOOLS, min_chars=100_000) is None
    assert shared_prefix_key("nonsense", TOOLS, min_chars=1) is None


def test_the_router_keys_the_typed_request_the_ingress_sends() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from router.serve_router import _prefix_key_of

    def typed(user: str) -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [SYSTEM, {"role": "user", "content": user}], "tools": TOOLS}
        )

    key = _prefix_key_of(typed("fix bug 1"), min_chars=100)
    assert key is not None and key == _prefix_key_of(typed("fix bug 2"), min_chars=100)
    assert key == shared_prefix_key([SYSTEM], TOOLS, min_chars=100)
    assert _prefix_key_of(None, min_chars=1) is None


def test_load_imbalance_is_the_busiest_replica_over_the_mean() -> None:
    from router.serve_router import load_imbalance

    assert load_imbalance([3, 1]) == 1.5
    assert load_imbalance([2, 2, 2]) == 1.0
    assert load_imbalance([0, 0]) == 1.0
    assert load_imbalance([]) == 1.0

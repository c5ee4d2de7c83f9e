"""The ingress's program bookkeeping: turn indexes, completion time and turns at
a program's end by last step, DELETE, idleness or eviction."""

from __future__ import annotations

from cluster.policies.program_clock import EndedProgram, ProgramClock, turn_bucket


def test_turns_are_counted_and_a_last_step_ends_the_program() -> None:
    clock = ProgramClock()
    assert clock.turn_started("p", 10.0) == (1, [])
    assert clock.turn_finished("p", 12.0, last_step=False) is None
    assert clock.turn_started("p", 20.0) == (2, [])  # 8 s in the client's tool
    assert clock.turn_finished("p", 23.5, last_step=True) == EndedProgram("p", 13.5, 2, "last_step")
    assert len(clock) == 0
    assert clock.turn_started("p", 30.0)[0] == 1, "an id used again is a new program"


def test_a_last_step_waits_for_the_programs_other_turns_in_flight() -> None:
    clock = ProgramClock()
    clock.turn_started("p", 0.0)
    clock.turn_started("p", 1.0)
    assert clock.turn_finished("p", 2.0, last_step=True) is None
    ended = clock.turn_finished("p", 3.0, last_step=False)
    assert ended is None and len(clock) == 1


def test_delete_and_idleness_end_programs() -> None:
    clock = ProgramClock()
    for program in ("a", "b", "c"):
        clock.turn_started(program, 0.0)
    clock.turn_finished("a", 5.0, last_step=False)
    clock.turn_finished("b", 50.0, last_step=False)
    assert clock.ended("a") == EndedProgram("a", 5.0, 1, "deleted")
    assert clock.ended("a") is None
    assert clock.idle(now=100.0, idle_s=60.0) == [], "b ended its turn 50 s ago; c is in flight"
    assert clock.idle(now=110.0, idle_s=60.0) == [EndedProgram("b", 50.0, 1, "idle")]
    assert len(clock) == 1


def test_beyond_its_bound_the_least_recently_used_program_is_evicted() -> None:
    clock = ProgramClock(max_programs=2)
    clock.turn_started("a", 0.0)
    clock.turn_finished("a", 1.0, last_step=False)
    clock.turn_started("b", 2.0)
    clock.turn_started("a", 3.0)  # a is now the most recently used
    _, evicted = clock.turn_started("c", 4.0)
    assert evicted == [], "b had no finished turn: nothing to report"
    _, evicted = clock.turn_started("d", 5.0)
    assert evicted == [EndedProgram("a", 1.0, 2, "evicted")]


def test_turn_buckets() -> None:
    labels = [turn_bucket(index) for index in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 500)]
    assert labels == [
        "1",
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
        "17-32",
        "33+",
        "33+",
    ]


def test_running_programs_are_counted_by_owner_until_they_end() -> None:
    clock = ProgramClock(max_programs=3)
    clock.turn_started("a1", 0.0, owner="a")
    clock.turn_started("a2", 0.0, owner="a")
    clock.turn_started("b1", 0.0, owner="b")
    clock.turn_started("a1", 1.0, owner="a")  # a second turn, not a second program
    assert (clock.running_programs("a"), clock.running_programs("b")) == (2, 1)
    assert clock.is_running("a1") and not clock.is_running("c1")
    clock.turn_finished("a1", 2.0, last_step=False)
    clock.turn_finished("a1", 2.0, last_step=True)
    clock.ended("b1")
    assert (clock.running_programs("a"), clock.running_programs("b")) == (1, 0)
    clock.turn_finished("a2", 3.0, last_step=False)
    clock.idle(100.0, idle_s=10.0)
    assert clock.running_programs("a") == 0
    for index in range(4):  # one past the limit: the least recently used goes
        clock.turn_started(f"c{index}", 200.0, owner="c")
    assert clock.running_programs("c") == 3

from hypothesis import given
from hypothesis import strategies as st

from cluster.policies.program_admission import ProgramAdmission


def _admission(pool_tokens: int = 1000, share: float = 1.0) -> ProgramAdmission:
    return ProgramAdmission(pool_tokens=pool_tokens, share=share, return_window_s=30)


def test_a_new_program_waits_while_the_started_ones_fill_the_budget() -> None:
    admission = _admission()
    assert admission.admits("a", 600, now=0, engine_busy=True)
    assert not admission.admits("b", 500, now=1, engine_busy=True)
    assert admission.admits("c", 400, now=1, engine_busy=True)  # fits beside a's 600
    assert admission.programs_held == 1


def test_a_started_program_is_never_held() -> None:
    admission = _admission()
    admission.admits("a", 900, now=0, engine_busy=True)
    admission.turn_finished("a", 2000, now=5)  # its context outgrew the pool
    admission.turn_arrived("a", 2100)
    assert admission.admits("a", 2100, now=6, engine_busy=True)
    assert admission.committed_tokens(now=6) == 2100


def test_an_idle_engine_starts_whatever_comes() -> None:
    admission = _admission()
    admission.admits("a", 900, now=0, engine_busy=True)
    assert not admission.would_admit("b", 500, now=1, engine_busy=True)
    assert admission.admits("b", 500, now=1, engine_busy=False)
    assert admission.is_started("b")


def test_a_program_away_longer_than_the_window_stops_counting() -> None:
    admission = _admission()
    admission.admits("a", 800, now=0, engine_busy=True)
    admission.turn_finished("a", 900, now=10)
    assert not admission.would_admit("b", 200, now=40, engine_busy=True)  # a may come back
    assert admission.would_admit("b", 200, now=40.5, engine_busy=True)


def test_an_ended_program_frees_its_share_and_comes_back_as_new() -> None:
    admission = _admission()
    admission.admits("a", 800, now=0, engine_busy=True)
    admission.turn_finished("a", 900, now=1)
    admission.ended("a")
    assert admission.committed_tokens(now=1) == 0
    assert not admission.is_started("a")


def test_a_held_program_is_counted_once() -> None:
    admission = _admission()
    admission.admits("a", 900, now=0, engine_busy=True)
    for step in range(3):
        assert not admission.admits("b", 500, now=step, engine_busy=True)
    assert admission.programs_held == 1
    admission.ended("a")
    assert admission.admits("b", 500, now=4, engine_busy=True)
    assert admission.programs_held == 1


def test_a_shared_preamble_counts_once_for_the_program_that_brought_it() -> None:
    admission = _admission()
    assert admission.admits("a", 600, now=0, engine_busy=True)
    # b and c find a's 500-token preamble cached: each adds only its own 200.
    assert admission.admits("b", 700, now=1, engine_busy=True, cached_tokens=500)
    assert admission.admits("c", 700, now=1, engine_busy=True, cached_tokens=500)
    assert admission.committed_tokens(now=1) == 1000
    assert not admission.admits("d", 700, now=1, engine_busy=True, cached_tokens=500)
    # b's context grows beyond its preamble: the growth counts, the preamble not.
    admission.turn_finished("b", 900, now=2)
    assert admission.committed_tokens(now=2) == 1200


def test_the_share_scales_the_budget() -> None:
    assert _admission(pool_tokens=1000, share=1.5).limit_tokens == 1500
    over = _admission(pool_tokens=1000, share=1.5)
    over.admits("a", 900, now=0, engine_busy=True)
    assert over.would_admit("b", 600, now=0, engine_busy=True)


def test_the_oldest_started_programs_are_forgotten_beyond_the_bound() -> None:
    admission = ProgramAdmission(pool_tokens=10**6, share=1, return_window_s=30, max_programs=2)
    for program in "abc":
        admission.admits(program, 10, now=0, engine_busy=True)
    assert not admission.is_started("a")
    assert admission.is_started("b") and admission.is_started("c")


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcdef"), st.integers(1, 600), st.integers(0, 700), st.booleans()
        ),
        max_size=40,
    )
)
def test_a_busy_engine_never_admits_a_new_program_past_the_budget(
    arrivals: list[tuple[str, int, int, bool]],
) -> None:
    admission = _admission()
    for step, (program, tokens, cached, finishes) in enumerate(arrivals):
        new = not admission.is_started(program)
        committed = admission.committed_tokens(now=step)
        admitted = admission.admits(
            program, tokens, now=step, engine_busy=True, cached_tokens=cached
        )
        if admitted and new:
            assert committed + max(0, tokens - cached) <= admission.limit_tokens
        elif not new:
            admission.turn_arrived(program, tokens)
        if finishes:
            admission.turn_finished(program, tokens, now=step)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "arrive", "finish", "end"]),
            st.sampled_from("abcd"),
            st.integers(1, 600),
            st.integers(0, 400),
            st.sampled_from([0, 0, 1, 20, 40]),
        ),
        max_size=60,
    )
)
def test_the_committed_total_sums_the_programs_that_run_wait_or_may_come_back(
    events: list[tuple[str, str, int, int, int]],
) -> None:
    """Each counts its context beyond the prefix it found cached when it started."""
    admission = ProgramAdmission(pool_tokens=10**6, share=1, return_window_s=30, max_programs=3)
    # context, turns in flight, last end, shared prefix; least recent first
    started: dict[str, list] = {}
    now = 0
    for event, program, tokens, cached, pause in events:
        now += pause
        if event == "admit" and program not in started:
            admission.admits(program, tokens, now=now, engine_busy=True, cached_tokens=cached)
            started[program] = [tokens, 1, None, min(cached, tokens)]
            if len(started) > 3:
                del started[next(iter(started))]
        elif event == "arrive" and program in started:
            admission.turn_arrived(program, tokens)
            _, in_flight, last_end, shared = started.pop(program)
            started[program] = [tokens, in_flight + 1, last_end, shared]
        elif event == "finish":
            admission.turn_finished(program, tokens, now=now)
            if program in started:
                _, in_flight, _, shared = started[program]
                started[program] = [tokens, max(0, in_flight - 1), now, shared]
        elif event == "end":
            admission.ended(program)
            started.pop(program, None)
        expected = sum(
            max(0, context - shared)
            for context, in_flight, last_end, shared in started.values()
            if in_flight > 0 or (last_end is not None and now - last_end <= 30)
        )
        assert admission.committed_tokens(now=now) == expected

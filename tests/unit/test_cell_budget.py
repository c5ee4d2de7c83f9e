"""Cell-budget admission (pure): a sequence's demand, and which sequences of a
queue start together under the budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cluster.policies.cell_budget import CellBudget, cell_demand


def test_demand_is_the_uncached_prompt_and_the_output_counted() -> None:
    assert cell_demand(prompt_tokens=1000, cached_tokens=640, output_tokens=200) == 560
    assert cell_demand(prompt_tokens=100, cached_tokens=100, output_tokens=0) == 0
    assert cell_demand(prompt_tokens=100, cached_tokens=0, output_tokens=-5) == 100


def test_an_idle_engine_admits_anything_and_a_busy_one_what_fits() -> None:
    budget = CellBudget(pool_cells=1000, share=0.9)
    assert budget.limit == 900
    assert budget.admits(demand=5000, committed=0, running=0)
    assert budget.admits(demand=400, committed=500, running=2)
    assert not budget.admits(demand=401, committed=500, running=2)


def _start(budget: CellBudget, queue: list[int]) -> list[int]:
    """The demands that start, in queue order, as the scheduler applies the
    budget: the first that does not fit holds everything behind it."""
    started: list[int] = []
    for demand in queue:
        if not budget.admits(demand, sum(started), len(started)):
            break
        started.append(demand)
    return started


@given(
    pool=st.integers(min_value=1, max_value=10_000),
    share=st.floats(min_value=0.05, max_value=1.0),
    queue=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=20),
)
def test_what_starts_together_fits_the_budget_unless_it_is_one_sequence(
    pool: int, share: float, queue: list[int]
) -> None:
    budget = CellBudget(pool_cells=pool, share=share)
    started = _start(budget, queue)
    assert started, "the first in the queue always starts on an idle engine"
    assert started == queue[: len(started)]
    assert len(started) == 1 or sum(started) <= budget.limit
    if len(started) < len(queue):
        assert sum(started) + queue[len(started)] > budget.limit

"""Pure: whether a new sequence's prefill may start now, given the KV cells
(token slots) the sequences already admitted may still claim."""

from __future__ import annotations

from dataclasses import dataclass


def cell_demand(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> int:
    """Cells a sequence may claim of its own: its prompt less what the prefix
    cache already holds (blocks others share), and the output it is counted for."""
    return max(0, prompt_tokens - cached_tokens) + max(0, output_tokens)


@dataclass(frozen=True)
class CellBudget:
    """The share of the KV pool the admitted sequences may claim together.

    A sequence whose demand does not fit waits, and so does every sequence
    behind it in the queue (admission stays first come, first served). An
    engine with nothing running admits whatever comes first, however large:
    the budget orders work, it never refuses it."""

    pool_cells: int
    share: float

    @property
    def limit(self) -> int:
        return int(self.pool_cells * self.share)

    def admits(self, demand: int, committed: int, running: int) -> bool:
        return running == 0 or committed + demand <= self.limit

"""Pure: whether a program new to an engine may start its first turn now, given
the contexts of the programs the engine already serves.

Program FCFS alone starts a new program whenever no older program's turn waits,
typically while the older programs' tools run. When their turns come back the
new program's KV is the first to go, and it computes its context again turn
after turn. Holding it until the programs already started leave room for it
trades that recomputation for a later start.

A prefix the pool holds already when a program starts (the instructions and
tool schemas its agent kind shares with others) is one copy in the pool: it
counts for the program that brought it, not again for each program that finds
it cached. Counting it per program held agents that share a long preamble for
a pool they fitted in."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Started:
    context_tokens: int
    shared_tokens: int
    """Of its first prompt, the tokens the pool held already when it started."""
    in_flight: int
    last_end: float | None

    @property
    def own_tokens(self) -> int:
        return max(0, self.context_tokens - self.shared_tokens)


class ProgramAdmission:
    """Programs started on one engine, by id (at most `max_programs`, the least
    recently used forgotten first). A started program counts its last known
    context, less the prefix it found cached when it started, against `share` of
    the pool while a turn of it runs or waits, and for `return_window_s` after
    its last turn ended (longer, it counts as not coming back). Times are
    seconds on one clock that does not go back."""

    def __init__(
        self,
        pool_tokens: int,
        share: float,
        return_window_s: float,
        max_programs: int = 100_000,
    ):
        self._limit = int(pool_tokens * share)
        self._return_window_s = return_window_s
        self._max_programs = max_programs
        self._started: OrderedDict[str, _Started] = OrderedDict()
        # The committed total is kept as it changes: the scheduler asks for it at
        # every step a new program waits, and started programs may number thousands.
        self._in_flight_tokens = 0
        self._returning: OrderedDict[str, None] = OrderedDict()
        """Started programs with no turn in flight, by when their last turn ended."""
        self._returning_tokens = 0
        self._held: set[str] = set()
        self.programs_held = 0
        """Programs whose first turn was held at least once."""

    @property
    def limit_tokens(self) -> int:
        return self._limit

    def is_started(self, program_id: str) -> bool:
        return program_id in self._started

    def committed_tokens(self, now: float) -> int:
        """Context tokens of the started programs that run, wait or may come back,
        less the prefixes they found cached when they started."""
        while self._returning:
            program_id = next(iter(self._returning))
            program = self._started[program_id]
            assert program.last_end is not None
            if now - program.last_end <= self._return_window_s:
                break
            del self._returning[program_id]
            self._returning_tokens -= program.own_tokens
        return self._in_flight_tokens + self._returning_tokens

    def would_admit(
        self,
        program_id: str,
        prompt_tokens: int,
        now: float,
        engine_busy: bool,
        cached_tokens: int = 0,
    ) -> bool:
        """Whether the program's turn may start: always for a started program or
        an idle engine, for a new one when its prompt, less the `cached_tokens`
        of it the pool holds already, fits beside the committed contexts."""
        return (
            program_id in self._started
            or not engine_busy
            or self.committed_tokens(now) + max(0, prompt_tokens - cached_tokens) <= self._limit
        )

    def admits(
        self,
        program_id: str,
        prompt_tokens: int,
        now: float,
        engine_busy: bool,
        cached_tokens: int = 0,
    ) -> bool:
        """`would_admit`, recorded: an admitted new program counts as started from
        here on, a held one among the programs held."""
        if program_id in self._started:
            return True
        if not self.would_admit(program_id, prompt_tokens, now, engine_busy, cached_tokens):
            if program_id not in self._held:
                self._held.add(program_id)
                self.programs_held += 1
            return False
        self._held.discard(program_id)
        program = _Started(prompt_tokens, min(cached_tokens, prompt_tokens), 1, None)
        self._started[program_id] = program
        self._in_flight_tokens += program.own_tokens
        while len(self._started) > self._max_programs:
            self._forget(next(iter(self._started)))
        return True

    def turn_arrived(self, program_id: str, prompt_tokens: int) -> None:
        """A turn of a started program arrived (a new program's first turn is
        counted when admitted)."""
        program = self._started.get(program_id)
        if program is not None:
            self._started.move_to_end(program_id)
            self._uncount(program_id, program)
            program.in_flight += 1
            program.context_tokens = prompt_tokens
            self._count(program_id, program)

    def turn_finished(self, program_id: str, context_tokens: int, now: float) -> None:
        """A turn of the program left the engine (finished or aborted)."""
        self._held.discard(program_id)
        program = self._started.get(program_id)
        if program is not None:
            self._uncount(program_id, program)
            program.in_flight = max(0, program.in_flight - 1)
            program.last_end = now
            program.context_tokens = context_tokens
            self._count(program_id, program)

    def ended(self, program_id: str) -> None:
        if program_id in self._started:
            self._forget(program_id)
        self._held.discard(program_id)

    def _forget(self, program_id: str) -> None:
        self._uncount(program_id, self._started.pop(program_id))

    def _count(self, program_id: str, program: _Started) -> None:
        if program.in_flight > 0:
            self._in_flight_tokens += program.own_tokens
        elif program.last_end is not None:
            self._returning[program_id] = None
            self._returning_tokens += program.own_tokens

    def _uncount(self, program_id: str, program: _Started) -> None:
        if program.in_flight > 0:
            self._in_flight_tokens -= program.own_tokens
        elif program_id in self._returning:
            del self._returning[program_id]
            self._returning_tokens -= program.own_tokens

"""Agent programs as the server sees them: each turn's index within its program,
and a program's completion time (its first turn's arrival to its last turn's
end) and turn count once it ends: by a last-step turn, `DELETE
/v1/sessions/{id}`, or no turn for `idle_s`. Pure bookkeeping; the ingress
turns its answers into metrics."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

TURN_INDEX_BUCKETS = ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"))
LATER_TURNS = "33+"


def turn_bucket(turn_index: int) -> str:
    """A label for a turn's 1-based index in its program: 1, 2, 3-4, ... 33+."""
    for upper, label in TURN_INDEX_BUCKETS:
        if turn_index <= upper:
            return label
    return LATER_TURNS


@dataclass(frozen=True)
class EndedProgram:
    program_id: str
    completion_s: float
    """First turn's arrival to last turn's end (time in the client's tools included)."""
    turns: int
    reason: str
    """`last_step`, `deleted`, `idle` or `evicted` (too many programs to track)."""


@dataclass
class _Program:
    first_arrival: float
    last_end: float | None
    turns: int
    in_flight: int
    owner: str


class ProgramClock:
    """Programs by id, oldest-used first; at most `max_programs` tracked (the
    least recently used beyond that ends as `evicted`)."""

    def __init__(self, max_programs: int = 100_000):
        self._programs: OrderedDict[str, _Program] = OrderedDict()
        self._max_programs = max_programs
        self._running_by_owner: Counter[str] = Counter()

    def turn_started(
        self, program_id: str, now: float, owner: str = ""
    ) -> tuple[int, list[EndedProgram]]:
        """The turn's 1-based index in its program, and programs evicted to make
        room. `owner` (a tenant) is recorded with a new program."""
        program = self._programs.get(program_id)
        evicted = []
        if program is None:
            program = self._programs[program_id] = _Program(now, None, 0, 0, owner)
            self._running_by_owner[owner] += 1
            while len(self._programs) > self._max_programs:
                oldest_id, oldest = self._pop(next(iter(self._programs)))
                evicted.append(_ended(oldest_id, oldest, "evicted"))
        self._programs.move_to_end(program_id)
        program.turns += 1
        program.in_flight += 1
        return program.turns, [e for e in evicted if e is not None]

    def turn_finished(self, program_id: str, now: float, last_step: bool) -> EndedProgram | None:
        """Records the turn's end; the program, if that was its last step."""
        program = self._programs.get(program_id)
        if program is None:
            return None
        program.in_flight -= 1
        program.last_end = now
        if last_step and program.in_flight == 0:
            self._pop(program_id)
            return _ended(program_id, program, "last_step")
        return None

    def ended(self, program_id: str) -> EndedProgram | None:
        """The client ended the program (`DELETE`)."""
        if program_id not in self._programs:
            return None
        return _ended(*self._pop(program_id), "deleted")

    def idle(self, now: float, idle_s: float) -> list[EndedProgram]:
        """Programs without a turn in flight whose last turn ended `idle_s` ago or more."""
        expired = [
            program_id
            for program_id, program in self._programs.items()
            if program.in_flight == 0
            and program.last_end is not None
            and now - program.last_end >= idle_s
        ]
        ended = [_ended(*self._pop(pid), "idle") for pid in expired]
        return [e for e in ended if e is not None]

    def is_running(self, program_id: str) -> bool:
        return program_id in self._programs

    def running_programs(self, owner: str) -> int:
        """Programs of `owner` started and not ended."""
        return self._running_by_owner[owner]

    def _pop(self, program_id: str) -> tuple[str, _Program]:
        program = self._programs.pop(program_id)
        self._running_by_owner[program.owner] -= 1
        if not self._running_by_owner[program.owner]:
            del self._running_by_owner[program.owner]
        return program_id, program

    def __len__(self) -> int:
        return len(self._programs)


def _ended(program_id: str, program: _Program, reason: str) -> EndedProgram | None:
    """None for a program none of whose turns ended (nothing to measure)."""
    if program.last_end is None:
        return None
    return EndedProgram(program_id, program.last_end - program.first_arrival, program.turns, reason)

"""Agents against engine replicas on one simulated clock.

Each program sends its turns one after another: a turn arrives, a router picks
its replica, the engine serves it, the front end reports the tool it called,
and the program's next turn arrives after the tool's pause. Events at one time
run in the order they were scheduled; the same programs and engines always give
the same result."""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.sim.engine import EngineCounters, SimEngine
from bench.sim.request import SimRequest


@dataclass(frozen=True)
class SimTurn:
    """A turn's prompt grows by `appended_tokens` (none for the first), it decodes
    `output_tokens`, calls `tool` (None: none), and the program is away `pause_s`."""

    appended_tokens: int
    output_tokens: int
    pause_s: float
    tool: str | None = None


@dataclass(frozen=True)
class SimProgram:
    program_id: str
    agent_type: str
    arrival_s: float
    first_prompt_tokens: int
    turns: tuple[SimTurn, ...]


class Router(Protocol):
    def route(self, program_id: str, now: float, engines: Mapping[str, SimEngine]) -> str: ...

    def turn_ended(self, program_id: str, now: float) -> None: ...

    def program_ended(self, program_id: str) -> None: ...


@dataclass
class ProgramOutcome:
    program_id: str
    agent_type: str
    arrival_s: float
    finished_s: float | None = None
    turns: list[SimRequest] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)

    @property
    def jct_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s


@dataclass(frozen=True)
class SimResult:
    programs: list[ProgramOutcome]
    engines: dict[str, EngineCounters]
    end_s: float

    @property
    def jct_mean_s(self) -> float:
        return statistics.fmean(
            outcome.jct_s for outcome in self.programs if outcome.jct_s is not None
        )

    @property
    def prefix_hit_rate(self) -> float:
        prompt = sum(counters.prompt_tokens for counters in self.engines.values())
        cached = sum(counters.prompt_tokens_cached for counters in self.engines.values())
        return cached / prompt if prompt else 0.0

    @property
    def preemptions(self) -> int:
        return sum(counters.preemptions for counters in self.engines.values())


class SimulationStuck(RuntimeError):
    """An engine holds requests it can never serve (a context larger than its pool)."""


class Simulation:
    def __init__(
        self,
        engines: Sequence[SimEngine],
        router: Router,
        shared_cores: bool = False,
    ):
        """`shared_cores`: the replicas share one machine's cores, as in the recorded
        CPU runs; a step then takes its time times the engines busy when it starts."""
        self._shared_cores = shared_cores
        self._engines = {engine.name: engine for engine in engines}
        self._router = router
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._sequence = itertools.count()
        self._stepping: set[str] = set()
        """Engines with their next step among the events."""
        self._request_ids = itertools.count()
        self._pending: dict[int, tuple[SimProgram, int]] = {}

    def _at(self, time: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (time, next(self._sequence), action))

    def run(self, programs: Sequence[SimProgram]) -> SimResult:
        outcomes = {
            program.program_id: ProgramOutcome(
                program.program_id, program.agent_type, program.arrival_s
            )
            for program in programs
        }
        for program in programs:
            self._at(program.arrival_s, self._turn_sender(program, 0, 0, outcomes))
        now = 0.0
        while self._events:
            now, _, action = heapq.heappop(self._events)
            action(now)
        return SimResult(
            list(outcomes.values()),
            {name: engine.counters for name, engine in self._engines.items()},
            now,
        )

    def _turn_sender(
        self,
        program: SimProgram,
        index: int,
        context_tokens: int,
        outcomes: dict[str, ProgramOutcome],
    ) -> Callable[[float], None]:
        def send(now: float) -> None:
            turn = program.turns[index]
            prompt = (
                program.first_prompt_tokens if index == 0 else context_tokens + turn.appended_tokens
            )
            name = self._router.route(program.program_id, now, self._engines)
            request = SimRequest(
                request_id=next(self._request_ids),
                program_id=program.program_id,
                prompt_tokens=prompt,
                output_tokens=turn.output_tokens,
                arrived_at=now,
                tool=turn.tool,
                last_step=index == len(program.turns) - 1,
            )
            outcome = outcomes[program.program_id]
            outcome.turns.append(request)
            outcome.replicas.append(name)
            self._pending[request.request_id] = (program, index)
            self._engines[name].add(request, now)
            self._wake(name, now, outcomes)

        return send

    def _wake(self, name: str, time: float, outcomes: dict[str, ProgramOutcome]) -> None:
        if name not in self._stepping:
            self._stepping.add(name)
            self._at(time, lambda now: self._step(name, now, outcomes))

    def _step(self, name: str, now: float, outcomes: dict[str, ProgramOutcome]) -> None:
        self._stepping.discard(name)
        engine = self._engines[name]
        pinned_before = engine.pinning.pinned_blocks if engine.pinning is not None else 0
        slowdown = 1
        if self._shared_cores:
            slowdown = sum(1 for other in self._engines.values() if other.busy)
        result = engine.step(now, max(1, slowdown))
        end = now + result.seconds
        for request in result.finished:
            program, index = self._pending.pop(request.request_id)
            engine.turn_ended(request.program_id, request.tool, end)
            self._router.turn_ended(request.program_id, end)
            if index + 1 < len(program.turns):
                self._at(
                    end + program.turns[index].pause_s,
                    self._turn_sender(program, index + 1, request.tokens, outcomes),
                )
            else:
                outcomes[program.program_id].finished_s = end
                engine.end_program(program.program_id, end)
                self._router.program_ended(program.program_id)
        if result.scheduled:
            self._wake(name, end, outcomes)
            return
        pinned_after = engine.pinning.pinned_blocks if engine.pinning is not None else 0
        if engine.waiting and pinned_after < pinned_before:
            self._wake(name, now, outcomes)  # pins went to make room: schedule again
        elif engine.waiting and not engine.running:
            head = engine.waiting[0]
            raise SimulationStuck(
                f"{name}: a request of {head.tokens} tokens cannot get its blocks"
            )
        elif engine.running:
            raise SimulationStuck(f"{name}: running requests scheduled nothing")

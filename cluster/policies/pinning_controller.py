"""Pinning policy: which finished turns keep their KV, for how long, and who lets go.

Pure bookkeeping over opaque block handles and explicit timestamps; the vLLM
scheduler extension (`deployments/engine/pinning/scheduler.py`) takes and drops
the block references this class decides on, so the policy is tested without an
engine.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from cluster.config import PinningConfig
from cluster.policies.tenancy import program_tenant
from cluster.policies.ttl_cost_model import (
    OffloadReload,
    PrefillProfile,
    RetentionHint,
    TtlCostModel,
)

DecisionSink = Callable[[dict[str, Any]], None]
"""Takes each decision of a controller as a plain, JSON-ready record (see
`pinning_log`)."""

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")

# Turns that end without a tool call are a class of their own for the cost model:
# agents often go on after them (a truncated or unusable reply, a nudge, a new
# user message), and how often and how soon is learned like a tool's duration.
NO_TOOL_CALL = "(no tool call)"


class ReleaseReason(enum.StrEnum):
    NEXT_TURN = "next_turn"
    EXPIRY = "expiry"
    PROGRAM_END = "program_end"
    PRESSURE = "pressure"
    TENANT_SHARE = "tenant_share"
    REPRICED = "repriced"
    MOVED = "moved"


@dataclass
class Pin:
    """A finished turn's KV blocks, referenced until released."""

    program_id: str
    blocks: list[Any]
    tokens: int
    created_at: float
    expires_at: float
    program_arrival: float
    tool: str | None = None
    hint: RetentionHint | None = None
    priority: int = 0
    """vLLM's order, lower first: under pressure, the highest value lets go first."""
    forked: bool = False
    """A sub-agent's program: it holds its parent's place, and lets go before it."""
    released_for: ReleaseReason | None = None


@dataclass(frozen=True)
class LedgerChange:
    """A pin to publish (expires_at set) or withdraw (expires_at None)."""

    program_id: str
    expires_at: float | None
    tokens: int = 0
    tool: str | None = None


@dataclass
class _Program:
    first_arrival: float
    turns: int = 0
    finished_at: float | None = None
    tool: str | None = None
    waiting_since: float | None = None
    pinned_on_arrival: bool = False
    awaiting_return: bool = False
    last_arrival: float = 0.0
    forked: bool = False


@dataclass
class PinningStats:
    """Counters since start, and samples since the last `take_stats`."""

    pins_created: int = 0
    releases: Counter[str] = field(default_factory=Counter)
    returning_turns: int = 0
    pin_hits: int = 0
    reused_prefix_tokens: int = 0
    pinned_blocks: int = 0
    pinned_tokens: int = 0
    chosen_ttls_s: list[float] = field(default_factory=list)
    holding_costs: list[float] = field(default_factory=list)
    tool_durations_s: list[tuple[str, float]] = field(default_factory=list)
    pinned_token_seconds: defaultdict[str, float] = field(
        default_factory=lambda: defaultdict(float)
    )
    """Tokens times seconds pins held KV, by outcome: `used` (the program came
    back to its pin) or `wasted` (released otherwise: expired, displaced, moved,
    the program ended)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain values only: the stats cross a process boundary."""
        return {
            name: dict(value) if isinstance(value, dict) else value
            for name, value in vars(self).items()
        }


_RECORDED_WHEN_ACTING = frozenset({"expire", "relieve_pressure"})


def _decision(
    method: Callable[_Params, _Result],
) -> Callable[_Params, _Result]:
    """Hands the call, its inputs and what it decided to the controller's decision
    sink, if it has one. Calls made from within another decision are part of it;
    calls that change nothing (an expiry check that expires nothing, pressure
    that finds no pin) are left out, so the log stays a log of decisions."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def decided(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        controller: PinningController = args[0]  # type: ignore[assignment]
        if controller._decision_sink is None or controller._deciding:
            return method(*args, **kwargs)
        away = len(controller._away)
        controller._deciding = True
        try:
            result = method(*args, **kwargs)
        finally:
            controller._deciding = False
        record = _decision_record(method.__name__, signature.bind(*args, **kwargs), result)
        changed_nothing = not record["released"] and away == len(controller._away)
        if not (method.__name__ in _RECORDED_WHEN_ACTING and changed_nothing):
            controller._decision_sink(record)
        return result

    return decided


def _decision_record(event: str, bound: inspect.BoundArguments, result: Any) -> dict[str, Any]:
    inputs = {name: _plain(name, value) for name, value in bound.arguments.items()}
    del inputs["self"]
    released: list[Pin] = []
    if isinstance(result, tuple):  # on_finished: whether it pinned, and what went first
        result, released = result
    elif isinstance(result, list):
        result, released = None, result
    return {
        "event": event,
        "inputs": inputs,
        "result": result,
        "released": [
            [pin.program_id, pin.released_for.value if pin.released_for else None]
            for pin in released
        ],
    }


def _plain(name: str, value: Any) -> Any:
    if name == "blocks":
        return len(value)  # opaque handles: only their number decides anything
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


class PinningController:
    """Decides pins for one engine. Times are Unix seconds (`time.time()`), the
    clock of vLLM's arrival times and of the ledger's expiries."""

    def __init__(
        self,
        cost_model: TtlCostModel,
        *,
        pinning_on: bool,
        total_blocks: int,
        max_pinned_fraction: float,
        max_tracked_programs: int,
        fcfs_horizon_s: float | None = None,
        tenant_max_pinned_fraction: float | None = None,
        decision_sink: DecisionSink | None = None,
    ):
        self.cost_model = cost_model
        self._decision_sink = decision_sink
        self._deciding = False
        self._fcfs_horizon_s = fcfs_horizon_s
        self._pinning_on = pinning_on
        self._max_pinned_blocks = int(total_blocks * max_pinned_fraction)
        self._max_tenant_pinned_blocks = (
            None
            if tenant_max_pinned_fraction is None
            else int(total_blocks * tenant_max_pinned_fraction)
        )
        self._pinned_blocks_by_tenant: Counter[str] = Counter()
        self._max_tracked_programs = max_tracked_programs
        self._programs: OrderedDict[str, _Program] = OrderedDict()
        self._pins: dict[str, Pin] = {}
        self._pinned_blocks = 0
        self._stats = PinningStats()
        self._ledger_changes: list[LedgerChange] = []
        # (finish time, program) of turns whose program has not come back yet: one
        # still away after the longest TTL counts as "never back" for its tool.
        self._away: deque[tuple[float, str]] = deque()

    @property
    def pins(self) -> list[Pin]:
        return list(self._pins.values())

    @property
    def pinned_blocks(self) -> int:
        return self._pinned_blocks

    def pinned_blocks_of(self, program_id: str) -> int:
        pin = self._pins.get(program_id)
        return len(pin.blocks) if pin is not None else 0

    def _program(self, program_id: str, now: float) -> _Program:
        program = self._programs.get(program_id)
        if program is None:
            program = self._programs[program_id] = _Program(first_arrival=now)
            while len(self._programs) > self._max_tracked_programs:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(program_id)
        return program

    @_decision
    def on_arrival(self, program_id: str, now: float, parent_id: str | None = None) -> float:
        """A turn of the program arrived; returns the program's first arrival. A
        program forked from `parent_id` starts with its parent's arrival, so its
        turns queue in the parent's place and a pin never makes one wait for the
        other."""
        parent = self._programs.get(parent_id) if parent_id else None
        if parent is not None and program_id not in self._programs:
            self._program(program_id, parent.first_arrival).forked = True
        program = self._program(program_id, now)
        program.turns += 1
        program.last_arrival = now
        if program.finished_at is not None:
            self._stats.returning_turns += 1
            if program.tool is not None and program.awaiting_return:
                self._observe_return(program_id, program.tool, now - program.finished_at)
            program.awaiting_return = False
            program.waiting_since = now
            program.pinned_on_arrival = program_id in self._pins
        return program.first_arrival

    @_decision
    def on_admitted(self, program_id: str, now: float, cached_tokens: int) -> list[Pin]:
        """The program's turn got its KV blocks; its pin is no longer needed."""
        program = self._programs.get(program_id)
        if program is not None and program.waiting_since is not None:
            if program.pinned_on_arrival and program_id in self._pins:
                self._stats.pin_hits += 1
                self._stats.reused_prefix_tokens += cached_tokens
            elif not program.pinned_on_arrival:
                self.cost_model.observe_queueing_delay_without_kv(now - program.waiting_since)
            program.waiting_since = None
        return self._release(program_id, ReleaseReason.NEXT_TURN, now)

    @_decision
    def on_finished(
        self,
        program_id: str,
        blocks: list[Any],
        tokens: int,
        now: float,
        last_step: bool,
        hint: RetentionHint | None = None,
        priority: int = 0,
    ) -> tuple[bool, list[Pin]]:
        """A turn finished. Returns whether to pin `blocks`, and pins to release first."""
        program = self._program(program_id, now)
        program.finished_at = now
        program.tool = None
        program.awaiting_return = False
        released = self._release(program_id, ReleaseReason.NEXT_TURN, now)
        if last_step:
            return False, released + self.end_program(program_id, now)
        if not self._pinning_on or not blocks:
            return False, released
        place = self.queue_time(program_id, now)
        while self._pinned_blocks + len(blocks) > self._max_pinned_blocks:
            victim = self.next_to_release(place, now)
            if victim is None:
                return False, released
            released += self._release(victim.program_id, ReleaseReason.PRESSURE, now)
        tenant = program_tenant(program_id)
        while (
            self._max_tenant_pinned_blocks is not None
            and self._pinned_blocks_by_tenant[tenant] + len(blocks) > self._max_tenant_pinned_blocks
        ):
            victim = self.next_to_release(place, now, tenant)
            if victim is None:
                return False, released
            released += self._release(victim.program_id, ReleaseReason.TENANT_SHARE, now)
        ttl = self.cost_model.ttl(None, tokens, hint=hint)
        pin = Pin(
            program_id,
            blocks,
            tokens,
            now,
            now + ttl,
            program.first_arrival,
            hint=hint,
            priority=priority,
            forked=program.forked,
        )
        self._pins[program_id] = pin
        self._pinned_blocks += len(blocks)
        self._pinned_blocks_by_tenant[tenant] += len(blocks)
        self._stats.pins_created += 1
        self._ledger_changes.append(LedgerChange(program_id, pin.expires_at, tokens))
        return True, released

    @_decision
    def on_turn_ended(
        self, program_id: str, tool: str | None, now: float, holding_cost: float = 1.0
    ) -> list[Pin]:
        """The front end parsed the finished turn: it called `tool`, or none (None).

        Either way the program may come back; the cost model sets the pin's TTL
        from how soon programs came back after such turns (or a fixed TTL until it
        has seen enough) and what holding the KV costs others now (`holding_cost`,
        see `ttl_policy.displaced_share`). Programs end by the last-step hint or
        the client.
        """
        tool = tool or NO_TOOL_CALL
        program = self._programs.get(program_id)
        if program is not None and program.finished_at is not None:
            program.tool = tool
            if program.last_arrival > program.finished_at:  # back before this report
                self._observe_return(program_id, tool, program.last_arrival - program.finished_at)
            else:
                program.awaiting_return = True
                self._away.append((program.finished_at, program_id))
        pin = self._pins.get(program_id)
        if pin is None:
            return []
        pin.tool = tool
        ttl = self._ttl(pin, holding_cost)
        self._stats.chosen_ttls_s.append(ttl)
        self._stats.holding_costs.append(holding_cost)
        pin.expires_at = pin.created_at + ttl
        if pin.expires_at <= now:
            return self._release(program_id, ReleaseReason.EXPIRY, now)
        self._ledger_changes.append(LedgerChange(program_id, pin.expires_at, pin.tokens, tool))
        return []

    @_decision
    def end_program(self, program_id: str, now: float | None = None) -> list[Pin]:
        program = self._programs.pop(program_id, None)
        if program is not None and program.turns:
            self.cost_model.observe_program_completed(program.turns)
        self.cost_model.forget_program(program_id)
        return self._release(program_id, ReleaseReason.PROGRAM_END, now)

    @_decision
    def release_moved(self, program_id: str, now: float | None = None) -> list[Pin]:
        """The router sent the program's next turn to another replica."""
        return self._release(program_id, ReleaseReason.MOVED, now)

    @_decision
    def expire(self, now: float) -> list[Pin]:
        self._count_programs_not_back(now)
        expired = [
            pin.program_id
            for pin in self._pins.values()
            if pin.expires_at <= now and not self._is_back(pin.program_id)
        ]
        return [
            pin
            for program_id in expired
            for pin in self._release(program_id, ReleaseReason.EXPIRY, now)
        ]

    def _is_back(self, program_id: str) -> bool:
        """The program's next turn arrived and waits for admission: its pin is about
        to pay off, so the TTL no longer applies (pressure still does)."""
        program = self._programs.get(program_id)
        return program is not None and program.waiting_since is not None

    def _observe_return(self, program_id: str, tool: str, duration: float) -> None:
        self.cost_model.observe_tool_duration(
            tool, duration, tenant=program_tenant(program_id), program_id=program_id
        )
        self._stats.tool_durations_s.append((tool, duration))

    def _ttl(self, pin: Pin, holding_cost: float) -> float:
        return self.cost_model.ttl(
            pin.tool,
            pin.tokens,
            holding_cost,
            pin.hint,
            tenant=program_tenant(pin.program_id),
            program_id=pin.program_id,
        )

    def _count_programs_not_back(self, now: float) -> None:
        horizon = now - self.cost_model.max_ttl_s
        while self._away and self._away[0][0] < horizon:
            finished_at, program_id = self._away.popleft()
            program = self._programs.get(program_id)
            if (
                program is not None
                and program.awaiting_return
                and program.finished_at == finished_at
                and program.tool is not None
            ):
                program.awaiting_return = False
                self.cost_model.observe_tool_duration(
                    program.tool,
                    math.inf,
                    tenant=program_tenant(program_id),
                    program_id=program_id,
                )

    def next_to_release(
        self,
        queued_after: float | None = None,
        now: float | None = None,
        tenant: str | None = None,
    ) -> Pin | None:
        """The pin to release first: the least important (highest vLLM priority
        value), then the program whose next turn would queue last (were it to come
        `now`; the latest arrived without a `now`), a fork before its parent;
        among programs that would queue after `queued_after` and of `tenant` when
        given."""

        def place(pin: Pin) -> float:
            if now is None:
                return pin.program_arrival
            return self._queue_place(pin.program_arrival, now)

        candidates = (
            pin
            for pin in self._pins.values()
            if (queued_after is None or place(pin) > queued_after)
            and (tenant is None or program_tenant(pin.program_id) == tenant)
        )
        return max(
            candidates,
            key=lambda pin: (pin.priority, place(pin), pin.forked),
            default=None,
        )

    @_decision
    def relieve_pressure(
        self, queued_after: float | None = None, now: float | None = None
    ) -> list[Pin]:
        """Release the next pin to go (memory is short). With `queued_after`, only
        a program whose next turn would queue after that may lose its pin: a
        waiting turn never waits for the pin of a program that queues after it."""
        victim = self.next_to_release(queued_after, now)
        if victim is None:
            return []
        return self._release(victim.program_id, ReleaseReason.PRESSURE, now)

    @_decision
    def queue_time(self, program_id: str, arrival: float) -> float:
        """Where a turn that arrived at `arrival` queues under program FCFS: at its
        program's first arrival, or with a horizon no earlier than the horizon
        before `arrival` (a program that arrived later then waits behind an older
        one's turns for about the horizon at most, not for all of them)."""
        program = self._programs.get(program_id)
        return self._queue_place(arrival if program is None else program.first_arrival, arrival)

    def _queue_place(self, first_arrival: float, arrival: float) -> float:
        if self._fcfs_horizon_s is None:
            return first_arrival
        return max(first_arrival, arrival - self._fcfs_horizon_s)

    def first_arrival(self, program_id: str) -> float | None:
        program = self._programs.get(program_id)
        return program.first_arrival if program is not None else None

    @_decision
    def reprice(self, now: float, holding_costs: dict[str, float]) -> list[Pin]:
        """Memory pressure changed: set each reported pin's TTL again with its
        holding cost now (`holding_costs` by program), releasing those whose new
        expiry has passed. A pin whose program is already back is left alone."""
        released: list[Pin] = []
        for program_id, pin in list(self._pins.items()):
            if pin.tool is None or program_id not in holding_costs or self._is_back(program_id):
                continue
            ttl = self._ttl(pin, holding_costs[program_id])
            expires_at = pin.created_at + ttl
            if expires_at == pin.expires_at:
                continue
            if expires_at <= now:
                released += self._release(program_id, ReleaseReason.REPRICED, now)
                continue
            pin.expires_at = expires_at
            self._ledger_changes.append(
                LedgerChange(program_id, pin.expires_at, pin.tokens, pin.tool)
            )
        return released

    @_decision
    def release_all(
        self, reason: ReleaseReason = ReleaseReason.PROGRAM_END, now: float | None = None
    ) -> list[Pin]:
        return [
            pin for program_id in list(self._pins) for pin in self._release(program_id, reason, now)
        ]

    def _release(self, program_id: str, reason: ReleaseReason, now: float | None) -> list[Pin]:
        """`now`: when, for the pinned token-seconds (None: not counted)."""
        pin = self._pins.pop(program_id, None)
        if pin is None:
            return []
        if now is not None:
            outcome = "used" if reason is ReleaseReason.NEXT_TURN else "wasted"
            self._stats.pinned_token_seconds[outcome] += pin.tokens * max(0.0, now - pin.created_at)
        self._pinned_blocks -= len(pin.blocks)
        tenant = program_tenant(program_id)
        self._pinned_blocks_by_tenant[tenant] -= len(pin.blocks)
        if not self._pinned_blocks_by_tenant[tenant]:
            del self._pinned_blocks_by_tenant[tenant]
        pin.released_for = reason
        self._stats.releases[reason.value] += 1
        self._ledger_changes.append(LedgerChange(program_id, None))
        return [pin]

    @_decision
    def set_prefill_profile(self, profile: PrefillProfile) -> None:
        """The engine timed its prefills: what losing a pin costs in recompute."""
        self.cost_model.prefill_profile = profile

    def take_stats(self) -> PinningStats:
        """Counters so far, with the samples gathered since the previous call."""
        stats = self._stats
        stats.pinned_blocks = self._pinned_blocks
        stats.pinned_tokens = sum(pin.tokens for pin in self._pins.values())
        self._stats = PinningStats(
            pins_created=stats.pins_created,
            releases=Counter(stats.releases),
            returning_turns=stats.returning_turns,
            pin_hits=stats.pin_hits,
            reused_prefix_tokens=stats.reused_prefix_tokens,
            pinned_token_seconds=defaultdict(float, stats.pinned_token_seconds),
        )
        return stats

    def take_ledger_changes(self) -> list[LedgerChange]:
        changes, self._ledger_changes = self._ledger_changes, []
        return changes


def pinning_controller(
    config: PinningConfig,
    total_blocks: int,
    offload_reload: OffloadReload | None = None,
    decision_sink: DecisionSink | None = None,
) -> PinningController:
    """The controller and cost model a pinning configuration describes, for an
    engine of `total_blocks` KV blocks (with a CPU tier under it: `offload_reload`).
    With a `decision_sink`, the sink takes a first record of this, then every
    decision."""
    controller = PinningController(
        TtlCostModel(
            fixed_ttl_s=config.fixed_ttl_s,
            max_ttl_s=config.max_ttl_s,
            min_tool_samples=config.min_tool_samples,
            sample_window=config.sample_window,
            default_memoryfulness=config.default_memoryfulness,
            use_cost_model=config.mode == "cost_model",
            durations_by=config.durations_by,
            idle_hold_factor=config.idle_hold_factor,
            max_tracked_programs=config.max_tracked_programs,
        ),
        pinning_on=config.mode != "off",
        total_blocks=total_blocks,
        max_pinned_fraction=config.max_pinned_fraction,
        max_tracked_programs=config.max_tracked_programs,
        fcfs_horizon_s=config.fcfs_horizon_s,
        tenant_max_pinned_fraction=config.tenant_max_pinned_fraction,
        decision_sink=decision_sink,
    )
    controller.cost_model.offload_reload = offload_reload
    if decision_sink is not None:
        decision_sink(
            {
                "event": "start",
                "config": config.model_dump(mode="json", include=set(PinningConfig.model_fields)),
                "total_blocks": total_blocks,
                "offload_reload": _plain("offload_reload", offload_reload),
            }
        )
    return controller

"""Which main-model replica serves a turn: pure functions of the program, what the
router remembers about it, and the replicas' in-flight load. No Ray, no Redis.

Order of preference: the replica holding the program's pinned KV (TTL ledger);
the replica that served its previous turn; for a new program with a long prompt
prefix other programs share, a replica chosen by that prefix (one already
serving it, or the one that took the fewest programs of it: `spread_prefixes`);
else consistent hashing of the program id. Those last two respect the
bounded-load rule of consistent hashing with bounded loads (Mirrokni et al.):
after routing, no replica holds more than ceil((1 + epsilon) * mean) requests in
flight; the first two, worth a whole prefill, a looser
ceil(affinity_load_factor * mean), and never while their replica has fewer
requests in flight than `affinity_free_slots`.

A program placed on a replica stays there for all its turns, so placement also
bounds the live programs (in flight, or between turns while a tool runs) per
replica by the same ceil((1 + epsilon) * mean) where it can: the in-flight count
at one instant misses every program that is away running a tool. Programs end
at different times, though, and a replica left with far more live programs than
the others, above ceil(affinity_load_factor * mean), gives up its returning
programs to the others, free engine slots or not: on a compute-bound engine
every program in a batch slows the others down, and that imbalance would last
for the rest of those programs' lives.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.config import RoutingConfig


class RoutingReason(enum.StrEnum):
    PINNED = "pinned"
    STICKY = "sticky"
    PREFIX = "prefix"
    HASHED = "hashed"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class RoutingDecision:
    replica_id: str
    reason: RoutingReason
    # The ledger named a replica that is gone or too busy: the pin is stale.
    stale_pin_replica: str | None = None


@dataclass(frozen=True)
class ProgramView:
    """What is known about a request's program when it is routed."""

    program_id: str
    pinned_replica: str | None = None
    previous_replica: str | None = None
    prefix_replicas: Mapping[str, int] = field(default_factory=dict)


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent-hash ring with virtual nodes; the walk order from a key's point."""

    def __init__(self, replica_ids: frozenset[str], virtual_nodes: int):
        points = sorted(
            (_hash64(f"{replica_id}#{index}"), replica_id)
            for replica_id in replica_ids
            for index in range(virtual_nodes)
        )
        self.replica_ids = replica_ids
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]

    def walk(self, key: str) -> list[str]:
        """Every replica once, starting at the key's owner, clockwise."""
        if not self._hashes:
            return []
        start = bisect.bisect_right(self._hashes, _hash64(key))
        order: list[str] = []
        for offset in range(len(self._owners)):
            owner = self._owners[(start + offset) % len(self._owners)]
            if owner not in order:
                order.append(owner)
                if len(order) == len(self.replica_ids):
                    break
        return order


def load_capacity(loads: Mapping[str, int], factor: float) -> int:
    """Most requests a replica may hold after one more is routed."""
    mean_after = (sum(loads.values()) + 1) / len(loads)
    return math.ceil(factor * mean_after)


class RoutingPolicy:
    """Chooses a replica for one request. Keeps only the hash ring between calls."""

    def __init__(
        self,
        load_epsilon: float,
        affinity_load_factor: float,
        virtual_nodes: int,
        affinity_free_slots: int = 0,
        spread_prefixes: bool = False,
    ):
        """`affinity_free_slots`: a pinned or returning program stays on its replica
        while that replica has fewer requests in flight, whatever the others carry.
        `spread_prefixes`: a new program goes to the replica that took the fewest
        programs of its prefix, rather than to one that took some."""
        if load_epsilon <= 0:
            raise ValueError("load_epsilon must be positive")
        if affinity_load_factor < 1 + load_epsilon:
            raise ValueError("affinity_load_factor must be at least 1 + load_epsilon")
        self.load_epsilon = load_epsilon
        self.affinity_load_factor = affinity_load_factor
        self.affinity_free_slots = affinity_free_slots
        self.spread_prefixes = spread_prefixes
        self._virtual_nodes = virtual_nodes
        self._ring = HashRing(frozenset(), virtual_nodes)

    def _ring_for(self, replica_ids: frozenset[str]) -> HashRing:
        if self._ring.replica_ids != replica_ids:
            self._ring = HashRing(replica_ids, self._virtual_nodes)
        return self._ring

    def choose(
        self,
        program: ProgramView,
        loads: Mapping[str, int],
        live_programs: Mapping[str, int] | None = None,
    ) -> RoutingDecision:
        """`loads`: in-flight requests of every replica that may take a request now
        (dead and draining replicas are simply absent). `live_programs`: programs
        each replica serves, in flight or between turns (none when absent)."""
        if not loads:
            raise ValueError("no replica to route to")
        capacity = load_capacity(loads, 1 + self.load_epsilon)
        programs = {replica_id: (live_programs or {}).get(replica_id, 0) for replica_id in loads}
        program_capacity = load_capacity(programs, 1 + self.load_epsilon)
        # Below its free slots the engine starts the turn at once with its KV
        # resident; moving would only trade a busier batch for a whole prefill.
        affinity_capacity = max(
            load_capacity(loads, self.affinity_load_factor), self.affinity_free_slots
        )
        crowded_above = math.ceil(
            self.affinity_load_factor * sum(programs.values()) / len(programs)
        )

        def fits(replica_id: str | None, limit: int = capacity) -> bool:
            return replica_id is not None and loads.get(replica_id, limit) < limit

        def places(replica_id: str) -> bool:
            return fits(replica_id) and programs[replica_id] < program_capacity

        def keeps(replica_id: str | None) -> bool:
            """A returning program stays here: within the looser in-flight bound
            (or free engine slots) and not crowded with live programs."""
            if replica_id is None or not fits(replica_id, affinity_capacity):
                return False
            return programs[replica_id] <= crowded_above

        stale_pin = None
        if program.pinned_replica is not None:
            if keeps(program.pinned_replica):
                return RoutingDecision(program.pinned_replica, RoutingReason.PINNED)
            stale_pin = program.pinned_replica
        elif keeps(program.previous_replica):
            # Unpinned, the previous turn's KV is often still in that replica's cache.
            assert program.previous_replica is not None
            return RoutingDecision(program.previous_replica, RoutingReason.STICKY)

        preferred_lost = stale_pin is not None or program.previous_replica is not None
        ring = self._ring_for(frozenset(loads))
        if not preferred_lost and program.prefix_replicas:
            taken = program.prefix_replicas
            if self.spread_prefixes:
                fewest = [r for r in ring.walk(program.program_id) if places(r)]
                if fewest:
                    best = min(fewest, key=lambda r: (taken.get(r, 0), programs[r], loads[r]))
                    return RoutingDecision(best, RoutingReason.PREFIX)
            owners = [r for r in taken if places(r)]
            if owners:
                best = min(owners, key=lambda r: (programs[r], loads[r], -taken[r], r))
                return RoutingDecision(best, RoutingReason.PREFIX)

        walk = ring.walk(program.program_id)
        # The least-loaded replica always fits the in-flight bound; both bounds
        # together may leave no replica, and then the in-flight one decides.
        chosen = next((r for r in walk if places(r)), None) or next(r for r in walk if fits(r))
        reason = RoutingReason.FALLBACK if preferred_lost else RoutingReason.HASHED
        return RoutingDecision(chosen, reason, stale_pin)


class ProgramDirectory:
    """The router's memory: the replica each recent program last went to, which
    programs are live (a turn in flight, or the last one ended within
    `live_after_turn_s`: the program is likely running a tool and coming back),
    and which replicas serve programs of each long prompt prefix. Bounded (LRU).
    Times are the caller's monotonic seconds."""

    def __init__(self, max_programs: int, max_prefixes: int, live_after_turn_s: float):
        self._max_programs = max_programs
        self._max_prefixes = max_prefixes
        self._live_after_turn_s = live_after_turn_s
        # Ordered by last activity (a turn routed or ended), oldest first.
        self._last_replica: OrderedDict[str, str] = OrderedDict()
        self._last_active: dict[str, float] = {}
        self._turns_in_flight: Counter[str] = Counter()
        self._prefix_replicas: OrderedDict[str, Counter[str]] = OrderedDict()

    def view(self, program_id: str, prefix_key: str | None, pinned: str | None) -> ProgramView:
        previous = self._last_replica.get(program_id)
        prefix = self._prefix_replicas.get(prefix_key) if prefix_key is not None else None
        return ProgramView(program_id, pinned, previous, dict(prefix or {}))

    def last_replica(self, program_id: str) -> str | None:
        return self._last_replica.get(program_id)

    def routed(
        self,
        program_id: str,
        prefix_key: str | None,
        replica_id: str,
        now: float,
        new_turn: bool = True,
    ) -> None:
        """`new_turn` False: a turn already routed was routed again (its replica was full)."""
        is_new = program_id not in self._last_replica
        self._touch(program_id, replica_id, now)
        if new_turn:
            self._turns_in_flight[program_id] += 1
        while len(self._last_replica) > self._max_programs:
            oldest, _ = self._last_replica.popitem(last=False)
            self._last_active.pop(oldest, None)
            self._turns_in_flight.pop(oldest, None)
        if prefix_key is None or not is_new:
            return
        owners = self._prefix_replicas.setdefault(prefix_key, Counter())
        owners[replica_id] += 1
        self._prefix_replicas.move_to_end(prefix_key)
        while len(self._prefix_replicas) > self._max_prefixes:
            self._prefix_replicas.popitem(last=False)

    def turn_ended(self, program_id: str, now: float) -> None:
        if self._turns_in_flight[program_id] > 1:
            self._turns_in_flight[program_id] -= 1
        else:
            self._turns_in_flight.pop(program_id, None)
        replica_id = self._last_replica.get(program_id)
        if replica_id is not None:
            self._touch(program_id, replica_id, now)

    def _touch(self, program_id: str, replica_id: str, now: float) -> None:
        self._last_replica[program_id] = replica_id
        self._last_replica.move_to_end(program_id)
        self._last_active[program_id] = now

    def live_programs(self, now: float) -> Counter[str]:
        """Live programs per replica."""
        live: set[str] = set(self._turns_in_flight)
        for program_id in reversed(self._last_replica):
            if now - self._last_active[program_id] > self._live_after_turn_s:
                break
            live.add(program_id)
        return Counter(self._last_replica[program_id] for program_id in live)

    def forget_program(self, program_id: str) -> None:
        self._last_replica.pop(program_id, None)
        self._last_active.pop(program_id, None)
        self._turns_in_flight.pop(program_id, None)

    def forget_replica(self, replica_id: str) -> None:
        for program_id in [p for p, r in self._last_replica.items() if r == replica_id]:
            self.forget_program(program_id)
        for owners in self._prefix_replicas.values():
            owners.pop(replica_id, None)


def configured_routing(
    config: RoutingConfig, engine_batch_slots: int
) -> tuple[RoutingPolicy, ProgramDirectory]:
    """The policy and the directory a routing configuration describes, for
    engines of `engine_batch_slots` sequences."""
    policy = RoutingPolicy(
        config.load_epsilon,
        config.affinity_load_factor,
        config.virtual_nodes,
        affinity_free_slots=engine_batch_slots if config.stay_while_engine_has_room else 0,
        spread_prefixes=config.prefix_placement == "spread",
    )
    directory = ProgramDirectory(
        max_programs=config.max_remembered_programs,
        max_prefixes=1024,
        live_after_turn_s=config.live_after_turn_s,
    )
    return policy, directory

"""Routers of the simulated replicas: toolserve's (its very routing policy and
program directory, with the engines' pins standing in for the TTL ledger) and
the stock ones it is compared with (consistent hashing of the session id, as
vLLM's router with session affinity does; the least loaded replica)."""

from __future__ import annotations

from collections.abc import Mapping

from bench.sim.engine import SimEngine
from cluster.config import RoutingConfig
from router.policy import HashRing, configured_routing


def in_flight(engines: Mapping[str, SimEngine]) -> dict[str, int]:
    return {name: len(engine.waiting) + len(engine.running) for name, engine in engines.items()}


class ToolserveRouting:
    def __init__(self, config: RoutingConfig, engine_batch_slots: int):
        self._policy, self._directory = configured_routing(config, engine_batch_slots)

    def route(self, program_id: str, now: float, engines: Mapping[str, SimEngine]) -> str:
        pinned = next(
            (
                name
                for name, engine in engines.items()
                if engine.pinning is not None and engine.pinning.pinned_blocks_of(program_id)
            ),
            None,
        )
        view = self._directory.view(program_id, None, pinned)
        decision = self._policy.choose(view, in_flight(engines), self._directory.live_programs(now))
        if decision.stale_pin_replica is not None:
            engines[decision.stale_pin_replica].release_moved(program_id, now)
        self._directory.routed(program_id, None, decision.replica_id, now)
        return decision.replica_id

    def turn_ended(self, program_id: str, now: float) -> None:
        self._directory.turn_ended(program_id, now)

    def program_ended(self, program_id: str) -> None:
        self._directory.forget_program(program_id)


class SessionHashRouting:
    """Every turn of a session to the replica its id hashes to."""

    def __init__(self, virtual_nodes: int = 100):
        self._virtual_nodes = virtual_nodes
        self._ring: HashRing | None = None

    def route(self, program_id: str, now: float, engines: Mapping[str, SimEngine]) -> str:
        names = frozenset(engines)
        if self._ring is None or self._ring.replica_ids != names:
            self._ring = HashRing(names, self._virtual_nodes)
        return self._ring.walk(program_id)[0]

    def turn_ended(self, program_id: str, now: float) -> None:
        pass

    def program_ended(self, program_id: str) -> None:
        pass


class LeastLoadedRouting:
    """Every turn to the replica with the fewest requests (ties: by name)."""

    def route(self, program_id: str, now: float, engines: Mapping[str, SimEngine]) -> str:
        loads = in_flight(engines)
        return min(loads, key=lambda name: (loads[name], name))

    def turn_ended(self, program_id: str, now: float) -> None:
        pass

    def program_ended(self, program_id: str) -> None:
        pass

"""Ray Serve request router for main-model replicas: asks the TTL ledger where a
program's KV is pinned, lets `RoutingPolicy` choose, and keeps the books (in-flight
load per replica, the router's program directory, stale pins, metrics).

Runs inside the ingress's deployment handle, on Serve's router event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Any, NamedTuple

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from cluster.config import RoutingConfig
from cluster.openai_protocol import PARENT_PROGRAM_ARG
from cluster.store._redis import UNREACHABLE
from cluster.store.pins import ControlOperation, PinningControl, PinStore
from cluster.store.replicas import ReplicaStatusStore
from router.policy import RoutingDecision, RoutingReason, configured_routing
from router.prefix import shared_prefix_key

logger = logging.getLogger("toolserve.router")

ROUTED_METHOD = "chat"
# Messages for a program's turn in flight: they go where its last turn went.
FOLLOWS_PROGRAM_METHODS = frozenset({"add_predicted_calls"})
_LEDGER_PAUSE_S = 5.0
# Ray drops a gauge's value from its metrics endpoint about two report intervals
# (20 s by default) after the last `set`: the router sets it again on this cadence.
_GAUGE_REFRESH_S = 5.0


class _RouterMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Counter as MetricCounter
        from ray.serve.metrics import Gauge

        self.routed = MetricCounter(
            "toolserve_router_requests",
            description="Main-model requests routed, by reason "
            "(pinned, sticky, prefix, hashed, fallback).",
            tag_keys=("reason",),
        )
        self.pinned_turns = MetricCounter(
            "toolserve_router_pinned_turns",
            description="Turns whose program had a pin in the TTL ledger, by outcome "
            "(hit: sent to the pin's replica; miss: sent elsewhere).",
            tag_keys=("outcome",),
        )
        self.imbalance = Gauge(
            "toolserve_router_load_imbalance",
            description="Most in-flight requests on one replica over the mean "
            "(1 when balanced or idle), refreshed every few seconds.",
        )


def _prefix_key_of(request: Any, min_chars: int) -> str | None:
    """The shared-prefix key of the typed chat request the ingress sends
    (`ChatCompletionRequest`: its messages are dicts, its tools pydantic models)."""
    tools = [
        tool if isinstance(tool, dict) else tool.model_dump(mode="json", exclude_none=True)
        for tool in getattr(request, "tools", None) or []
    ]
    return shared_prefix_key(getattr(request, "messages", None), tools, min_chars)


def _parent_of(request: Any) -> str | None:
    """The program a forked program's turn names as its parent (`vllm_xargs`)."""
    parent = (getattr(request, "vllm_xargs", None) or {}).get(PARENT_PROGRAM_ARG)
    return parent if isinstance(parent, str) else None


class _Booking(NamedTuple):
    replica_id: str
    program_id: str


def load_imbalance(in_flight: list[int]) -> float:
    """The busiest replica's in-flight requests over the mean; 1 when balanced,
    idle or without replicas."""
    mean = sum(in_flight) / len(in_flight) if in_flight else 0.0
    return max(in_flight) / mean if mean else 1.0


def _serving(replicas: list[RunningReplica]) -> list[RunningReplica]:
    """Replicas whose engine is ready (`ModelServer.record_routing_stats`); all of
    them while none is, so requests get the loading replica's clear 503."""
    ready = [replica for replica in replicas if replica.routing_stats.get("engine_ready")]
    return ready or replicas


class SessionRouter(RequestRouter):  # type: ignore[misc]
    """toolserve's main-model router (`RoutingConfig.policy: session`)."""

    def initialize_state(self, **kwargs: Any) -> None:
        redis_url = kwargs.pop("redis_url")
        engine_batch_slots = kwargs.pop("engine_batch_slots")
        self._deployment_id: str = kwargs.pop("deployment_id")
        config = RoutingConfig(**kwargs)
        self._config = config
        self._redis_url: str | None = redis_url
        self._pins: PinStore | None = None
        self._statuses: ReplicaStatusStore | None = None
        self._ledger_paused_until = 0.0
        self._policy, self._directory = configured_routing(config, engine_batch_slots)
        self._in_flight: Counter[str] = Counter()
        self._request_booking: dict[str, _Booking] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._metrics: _RouterMetrics | None = None
        self._gauge_refresher: asyncio.Task[None] | None = None

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        if pending_request.metadata.call_method in FOLLOWS_PROGRAM_METHODS:
            last = self._directory.last_replica(pending_request.metadata.session_id)
            with_turn = [r for r in candidate_replicas if r.replica_id.unique_id == last]
            return [with_turn or candidate_replicas]
        if pending_request.metadata.call_method != ROUTED_METHOD:
            return [candidate_replicas]  # status probes and the like: least loaded
        by_id = {replica.replica_id.unique_id: replica for replica in _serving(candidate_replicas)}
        loads = {replica_id: self._in_flight[replica_id] for replica_id in self._open(by_id)}
        metadata = pending_request.metadata
        program_id = metadata.session_id or metadata.internal_request_id
        prefix_key = _prefix_key_of(
            pending_request.args[0] if pending_request.args else None,
            self._config.min_prefix_chars,
        )
        pinned = await self._pinned_replica(program_id)
        view = self._directory.view(program_id, prefix_key, pinned)
        parent_id = _parent_of(pending_request.args[0] if pending_request.args else None)
        if parent_id is not None and pinned is None and view.previous_replica is None:
            # A fork's first turns go where its parent's KV is, to share its prefix.
            parent_replica = await self._pinned_replica(parent_id)
            view = replace(
                view, previous_replica=parent_replica or self._directory.last_replica(parent_id)
            )
        decision = self._policy.choose(view, loads, self._directory.live_programs(time.monotonic()))
        self._book(metadata.internal_request_id, program_id, prefix_key, decision, pinned)
        return [[by_id[decision.replica_id]]]

    def _open(self, by_id: dict[str, RunningReplica]) -> list[str]:
        """Replicas not known to be at max_ongoing_requests (all, if every one is)."""
        open_ids = []
        for replica_id, replica in by_id.items():
            queue_len = self.replica_queue_len_cache.get(replica.replica_id)
            if queue_len is None or queue_len < replica.max_ongoing_requests:
                open_ids.append(replica_id)
        return open_ids or list(by_id)

    async def _pinned_replica(self, program_id: str) -> str | None:
        if self._redis_url is None or time.monotonic() < self._ledger_paused_until:
            return None
        if self._pins is None:
            self._pins = PinStore(self._redis_url)
        try:
            entry = await asyncio.wait_for(
                self._pins.lookup(program_id), self._config.ledger_timeout_s
            )
        except (*UNREACHABLE, TimeoutError) as error:
            logger.warning(
                "ttl ledger unavailable (%s); routing without pins for %.0f s",
                type(error).__name__,
                _LEDGER_PAUSE_S,
            )
            self._ledger_paused_until = time.monotonic() + _LEDGER_PAUSE_S
            return None
        return None if entry is None else entry.replica_id

    def _book(
        self,
        request_id: str,
        program_id: str,
        prefix_key: str | None,
        decision: RoutingDecision,
        pinned: str | None,
    ) -> None:
        # A request that waited for a full replica is chosen again: move its load.
        previous = self._request_booking.get(request_id)
        if previous is not None:
            self._in_flight[previous.replica_id] -= 1
        self._request_booking[request_id] = _Booking(decision.replica_id, program_id)
        self._in_flight[decision.replica_id] += 1
        self._directory.routed(
            program_id, prefix_key, decision.replica_id, time.monotonic(), new_turn=previous is None
        )
        if decision.stale_pin_replica is not None:
            self._spawn(self._release_stale_pin(program_id, decision.stale_pin_replica))

        metrics = self._metrics = self._metrics or _RouterMetrics()
        metrics.routed.inc(tags={"reason": decision.reason.value})
        if pinned is not None and previous is None:
            hit = decision.reason is RoutingReason.PINNED
            metrics.pinned_turns.inc(tags={"outcome": "hit" if hit else "miss"})
        self._report_imbalance(metrics)
        if self._gauge_refresher is None:
            self._gauge_refresher = self._event_loop.create_task(self._refresh_gauges(metrics))

    def _report_imbalance(self, metrics: _RouterMetrics) -> None:
        in_flight = [self._in_flight[replica_id] for replica_id in self._alive_replica_ids()]
        metrics.imbalance.set(load_imbalance(in_flight))

    async def _refresh_gauges(self, metrics: _RouterMetrics) -> None:
        while True:
            await asyncio.sleep(_GAUGE_REFRESH_S)
            self._report_imbalance(metrics)

    async def _release_stale_pin(self, program_id: str, replica_id: str) -> None:
        assert self._pins is not None  # a stale pin came from the ledger
        await self._pins.drop(program_id, replica_id)
        if replica_id in self._alive_replica_ids():
            await self._pins.send_control(
                PinningControl(ControlOperation.RELEASE_PIN, program_id, replica_id)
            )

    def _alive_replica_ids(self) -> set[str]:
        return {replica_id.unique_id for replica_id in self._replicas}

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        booked = self._request_booking.pop(internal_request_id, None)
        if booked is not None:
            self._directory.turn_ended(booked.program_id, time.monotonic())
            self._in_flight[booked.replica_id] -= 1
            if self._in_flight[booked.replica_id] <= 0:
                del self._in_flight[booked.replica_id]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = self._alive_replica_ids()
        super().update_replicas(replicas)
        for gone in before - self._alive_replica_ids():
            self._forget_replica(gone)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget_replica(replica_id.unique_id)

    def _forget_replica(self, replica_id: str) -> None:
        """A dead or draining replica: its programs, ledger entries and status
        report go (`/health` would count a killed replica's report as a ready
        replica until it expires)."""
        self._directory.forget_replica(replica_id)
        self._in_flight.pop(replica_id, None)
        if self._redis_url is not None:
            self._spawn(self._clear_pins(replica_id))
            self._spawn(self._clear_status(replica_id))

    async def _clear_status(self, replica_id: str) -> None:
        assert self._redis_url is not None
        self._statuses = self._statuses or ReplicaStatusStore(self._redis_url)
        await self._statuses.forget(self._deployment_id, replica_id)

    async def _clear_pins(self, replica_id: str) -> None:
        if self._pins is None and self._redis_url is not None:
            self._pins = PinStore(self._redis_url)
        if self._pins is not None:
            cleared = await self._pins.clear_replica(replica_id)
            logger.info("replica %s left: dropped %d ledger entries", replica_id, cleared)

    def _spawn(self, coroutine: Any) -> None:
        task = self._event_loop.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

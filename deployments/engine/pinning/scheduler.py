"""vLLM scheduler extension: keeps a finished turn's hashed KV blocks referenced
while the program's tool runs, orders waiting requests by program arrival,
unpins later programs when the waiting head cannot get its blocks, and (with
program admission) holds a new program's first turn until the programs already
started leave it room.

Composed in `engine/schedulers.py`, which vLLM loads by name inside the
EngineCore process (`scheduler_cls`); the policy lives
in `PinningController`, this module only takes and drops block references.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from cluster.openai_protocol import (
    EXPECTED_TOOL_ARG,
    LAST_STEP_ARG,
    PARENT_PROGRAM_ARG,
    RETAIN_FOR_ARG,
)
from cluster.policies.pinning_controller import Pin, pinning_controller
from cluster.policies.program_admission import ProgramAdmission
from cluster.policies.ttl_cost_model import (
    OffloadReload,
    PrefillProfile,
    RetentionHint,
    holding_cost,
)
from deployments.engine.kv_offload import kv_bytes_per_token
from deployments.engine.pinning.decision_log import DecisionLogFile
from deployments.engine.pinning.ledger import LedgerPublisher
from deployments.engine.pinning.settings import EnginePinningSettings
from deployments.engine.plugin import EngineOperation

logger = logging.getLogger("toolserve.pinning.scheduler")

_PINNABLE = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED})
_ADMISSIBLE = frozenset({RequestStatus.WAITING, RequestStatus.PREEMPTED})
# A preempted turn computed tokens once (vLLM counts them again from zero).
_RESUMING = frozenset({RequestStatus.PREEMPTED})


class PinningSchedulerMixin:
    """Mixed in before vLLM's Scheduler or AsyncScheduler."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base: Scheduler = self
        settings = EnginePinningSettings.from_additional_config(base.vllm_config.additional_config)
        if settings is None:
            raise ValueError("the pinning scheduler needs toolserve_pinning in additional_config")
        self._settings = settings
        self._block_pool = base.kv_cache_manager.block_pool
        offload_reload = None
        if settings.offload_reload_bytes_per_s is not None:
            # Per worker under tensor parallelism: each GPU copies its own shard.
            offload_reload = OffloadReload(
                kv_bytes_per_token(base.kv_cache_config), settings.offload_reload_bytes_per_s
            )
        self._decision_log = (
            DecisionLogFile(settings.decision_log_dir, settings.replica_id)
            if settings.decision_log_dir
            else None
        )
        self._pinning = pinning_controller(
            settings,
            self._block_pool.num_gpu_blocks,
            offload_reload,
            self._decision_log.write if self._decision_log is not None else None,
        )
        self._awaiting_admission: dict[str, str] = {}
        self._repriced_for: str | None = None
        admission_share = settings.admission_share
        self._program_admission = (
            ProgramAdmission(
                pool_tokens=self._block_pool.num_gpu_blocks * base.block_size,
                share=admission_share,
                return_window_s=settings.max_ttl_s,
                max_programs=settings.max_tracked_programs,
            )
            if admission_share is not None
            else None
        )
        self._holding_new_program = False
        self._ledger = (
            LedgerPublisher(settings.redis_url, settings.replica_id)
            if settings.redis_url and settings.mode != "off"
            else None
        )

    def add_request(self, request: Request) -> None:
        base: Scheduler = self
        program_id = request.session_id
        if program_id and request.request_id not in base.requests:
            parent_id = _extra_args(request).get(PARENT_PROGRAM_ARG)
            self._pinning.on_arrival(
                program_id, time.time(), parent_id if isinstance(parent_id, str) else None
            )
            if self._settings.program_fcfs:
                request.arrival_time = self._pinning.queue_time(program_id, request.arrival_time)
            self._awaiting_admission[request.request_id] = program_id
            if self._program_admission is not None:
                self._program_admission.turn_arrived(program_id, request.num_tokens)
        super().add_request(request)  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        base: Scheduler = self
        now = time.time()
        self._release(self._pinning.expire(now))
        # Running requests need a fresh block now and then; pins must not make them
        # preempt each other.
        running_reserve = len(base.running)
        self._unpin_until_free(running_reserve, now)
        head = self._waiting_head()
        if head is not None:
            self._admit(head, running_reserve, now)
        self._holding_new_program = False
        output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        for new_request in output.scheduled_new_reqs:
            program_id = self._awaiting_admission.pop(new_request.req_id, None)
            if program_id is not None:
                request = base.requests[new_request.req_id]
                prefill = request.prefill_stats
                cached = prefill.num_local_cached_tokens if prefill is not None else 0
                self._release(self._pinning.on_admitted(program_id, now, cached))
        if output.preempted_req_ids:
            self._release(self._pinning.relieve_pressure(now=now))
        head = self._waiting_head()
        if output.total_num_scheduled_tokens == 0 and head is not None:
            # Nothing could run: earlier programs' pins go too, latest first.
            self._unpin_until_free(self._blocks_to_admit(head), now)
        self._publish()
        return output

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        if self._program_admission is not None and not self._admits_program(request):
            return False
        ready: bool = super()._handle_blocked_waiting_request(request)  # type: ignore[misc]
        return ready

    def _admits_program(self, request: Request) -> bool:
        """Program admission: a new program's first turn waits while the started
        programs' contexts fill the budget, and so does every new program behind it."""
        assert self._program_admission is not None
        program_id = request.session_id
        if not program_id or request.num_computed_tokens or request.status in _RESUMING:
            return True
        if self._program_admission.is_started(program_id):
            return True
        if self._holding_new_program:
            return False
        base: Scheduler = self
        admitted = self._program_admission.admits(
            program_id,
            request.num_tokens,
            time.time(),
            engine_busy=bool(base.running),
            cached_tokens=self._cached_tokens(request),
        )
        self._holding_new_program = not admitted
        return admitted

    def _waiting_head(self) -> Request | None:
        """The request vLLM admits next, unless requests holding blocks come first."""
        base: Scheduler = self
        if base.kv_holding_waiting or not base.waiting:
            return None
        head = base.waiting.peek_request()
        if head.status not in _ADMISSIBLE or self._holds_new_program(head):
            return None
        return head

    def _holds_new_program(self, request: Request) -> bool:
        base: Scheduler = self
        admission = self._program_admission
        return (
            admission is not None
            and bool(request.session_id)
            and not admission.is_started(request.session_id)
            and not admission.would_admit(
                request.session_id,
                request.num_tokens,
                time.time(),
                bool(base.running),
                self._cached_tokens(request),
            )
        )

    def _cached_tokens(self, request: Request) -> int:
        """Tokens of the request's prompt the prefix cache holds now."""
        base: Scheduler = self
        _, cached, _ = base.kv_cache_manager.get_computed_blocks(request)
        return int(cached)

    def _admit(self, head: Request, running_reserve: int, now: float) -> None:
        """Continuum's admission rule: when the head cannot get its blocks, programs
        that arrived after it lose their pins, latest first; pins of earlier
        programs are priced again at the pressure the head adds."""
        if self._block_pool.get_num_free_blocks() >= running_reserve + self._blocks_of(head):
            return  # fits without counting its cached blocks
        needed = running_reserve + self._blocks_to_admit(head)
        if self._block_pool.get_num_free_blocks() >= needed:
            return
        self._unpin_until_free(needed, now, queued_after=self._queue_place(head))
        if (
            self._block_pool.get_num_free_blocks() < needed
            and head.request_id != self._repriced_for
        ):
            self._repriced_for = head.request_id
            waiting_blocks = self._waiting_blocks()
            holding_costs = {
                pin.program_id: self._holding_cost(pin.program_id, waiting_blocks)
                for pin in self._pinning.pins
            }
            self._release(self._pinning.reprice(now, holding_costs))

    def _queue_place(self, request: Request) -> float:
        """The request's place in the program order pins are released by."""
        if self._settings.program_fcfs:
            queue_time: float = request.arrival_time  # set on arrival
            return queue_time
        first_arrival = (
            self._pinning.first_arrival(request.session_id) if request.session_id else None
        )
        return request.arrival_time if first_arrival is None else first_arrival

    def _blocks_of(self, request: Request) -> int:
        """Blocks of the request's whole context and one more token."""
        base: Scheduler = self
        per_group: int = math.ceil((request.num_tokens + 1) / base.block_size)
        return per_group * len(base.kv_cache_config.kv_cache_groups)

    def _blocks_to_admit(self, request: Request) -> int:
        """Free blocks the request takes: all of its blocks less the cached ones
        others hold already (cached blocks nobody holds count among the free)."""
        base: Scheduler = self
        computed, _, _ = base.kv_cache_manager.get_computed_blocks(request)
        held = sum(1 for group in computed.blocks for block in group if block.ref_cnt > 0)
        return self._blocks_of(request) - held

    def _unpin_until_free(self, blocks: int, now: float, queued_after: float | None = None) -> None:
        while self._pinning.pinned_blocks and self._block_pool.get_num_free_blocks() < blocks:
            released = self._pinning.relieve_pressure(queued_after, now)
            if not released:
                return
            self._release(released)

    def _waiting_blocks(self) -> int:
        base: Scheduler = self
        return sum(math.ceil(request.num_tokens / base.block_size) for request in base.waiting)

    def _holding_cost(self, program_id: str, waiting_blocks: int | None = None) -> float:
        return holding_cost(
            free_blocks=self._block_pool.get_num_free_blocks(),
            waiting_blocks=self._waiting_blocks() if waiting_blocks is None else waiting_blocks,
            own_blocks=self._pinning.pinned_blocks_of(program_id),
            charge_withheld_cache=self._settings.charge_withheld_cache,
        )

    def _free_blocks(self, request: Request) -> None:
        base: Scheduler = self
        self._awaiting_admission.pop(request.request_id, None)
        program_id = request.session_id
        extra_args = _extra_args(request)
        if program_id and self._program_admission is not None:
            self._program_admission.turn_finished(program_id, request.num_tokens, time.time())
            if extra_args.get(LAST_STEP_ARG):
                self._program_ended(program_id)
        if program_id and request.status in _PINNABLE:
            blocks = [
                block
                for group in base.kv_cache_manager.get_blocks(request.request_id).blocks
                for block in group
                if block.block_hash is not None and not block.is_null
            ]
            pin_now, released = self._pinning.on_finished(
                program_id,
                blocks,
                request.num_tokens,
                time.time(),
                bool(extra_args.get(LAST_STEP_ARG)),
                _retention_hint(extra_args),
                request.priority,
            )
            self._release(released)
            if pin_now:
                self._block_pool.touch(blocks)
        super()._free_blocks(request)  # type: ignore[misc]

    def _program_ended(self, program_id: str) -> None:
        """The program ended or moved to another replica: it no longer counts here."""
        if self._program_admission is not None:
            self._program_admission.ended(program_id)

    def _release(self, pins: list[Pin]) -> None:
        for pin in pins:
            # Tail blocks first, so the cache evicts a context from its end.
            self._block_pool.free_blocks(reversed(pin.blocks))

    def _publish(self) -> None:
        changes = self._pinning.take_ledger_changes()
        if self._ledger is not None:
            self._ledger.publish(changes)
        if self._decision_log is not None:
            self._decision_log.flush()

    def pinning_control(self, operation: str, arguments: list[Any]) -> Any:
        """Calls from the replica (through EngineCore, see plugin.py)."""
        now = time.time()
        match EngineOperation(operation):
            case EngineOperation.TURN_ENDED:
                program_id, tool = arguments
                holding_cost = self._holding_cost(program_id)
                self._release(self._pinning.on_turn_ended(program_id, tool, now, holding_cost))
            case EngineOperation.END_PROGRAM:
                (program_id,) = arguments
                self._program_ended(program_id)
                self._release(self._pinning.end_program(program_id, now))
            case EngineOperation.RELEASE_PIN:
                (program_id,) = arguments
                self._program_ended(program_id)
                self._release(self._pinning.release_moved(program_id, now))
            case EngineOperation.SET_PREFILL_PROFILE:
                self._pinning.set_prefill_profile(PrefillProfile(*arguments))
            case EngineOperation.STATS:
                stats = self._pinning.take_stats().as_dict()
                stats["free_blocks"] = self._block_pool.get_num_free_blocks()
                stats["total_blocks"] = self._block_pool.num_gpu_blocks
                stats["programs_held"] = (
                    self._program_admission.programs_held if self._program_admission else 0
                )
                self._publish()
                return stats
        self._publish()
        return None

    def shutdown(self) -> None:
        self._release(self._pinning.release_all(now=time.time()))
        self._publish()
        if self._ledger is not None:
            self._ledger.close()
        if self._decision_log is not None:
            self._decision_log.close()
        super().shutdown()  # type: ignore[misc]


def _extra_args(request: Request) -> dict[str, Any]:
    return (request.sampling_params.extra_args if request.sampling_params else None) or {}


def _retention_hint(extra_args: dict[str, Any]) -> RetentionHint | None:
    retain_for_s = extra_args.get(RETAIN_FOR_ARG)
    expected_tool_s = extra_args.get(EXPECTED_TOOL_ARG)
    if retain_for_s is None and expected_tool_s is None:
        return None
    return RetentionHint(
        retain_for_s=None if retain_for_s is None else float(retain_for_s),
        expected_tool_s=None if expected_tool_s is None else float(expected_tool_s),
    )

"""One engine replica on a simulated clock: continuous batching over a KV pool in
blocks with a prefix cache, as vLLM schedules (running sequences first, each
step's tokens within a budget, preemption by recompute when blocks run out,
then waiting requests in queue order while their blocks fit), and, for
toolserve's engine, the very pinning controller and TTL cost model the engine
runs, called where its scheduler extension calls them."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from bench.sim.blocks import BlockPool
from bench.sim.drafts import NgramDrafts
from bench.sim.request import SimRequest
from bench.sim.step_time import StepTimeModel, StepWork
from cluster.policies.pinning_controller import Pin, PinningController
from cluster.policies.ttl_cost_model import holding_cost


class SimEngineSettings(BaseModel):
    """The engine's shape: its KV pool and batch limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks: int = Field(gt=0, description="Blocks in the KV pool.")
    block_size: int = Field(gt=0, description="Tokens per block.")
    max_num_seqs: int = Field(gt=0, description="Most sequences running at once.")
    max_batched_tokens: int = Field(gt=0, description="Most tokens computed in one step.")


@dataclass
class EngineCounters:
    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    preemptions: int = 0


@dataclass(frozen=True)
class StepResult:
    scheduled: int
    """Requests that computed tokens in the step (none: the step did nothing)."""
    seconds: float
    finished: list[SimRequest]


@dataclass(frozen=True)
class _Scheduled:
    request: SimRequest
    tokens: int
    """Context tokens computed: a prefill chunk, or a decoding sequence's last one."""
    decode: bool
    drafts: int = 0
    """Proposed tokens verified beside a decoding sequence's last one."""


@dataclass(frozen=True)
class PinningGlue:
    """toolserve's engine: the controller and the scheduler's settings for it."""

    controller: PinningController
    program_fcfs: bool
    charge_withheld_cache: bool = False


class SimEngine:
    def __init__(
        self,
        name: str,
        settings: SimEngineSettings,
        step_time: StepTimeModel,
        pinning: PinningGlue | None = None,
        drafts: NgramDrafts | None = None,
    ):
        self.name = name
        self._drafts = drafts
        self.settings = settings
        self.pool = BlockPool(settings.blocks)
        self._step_time = step_time
        self._pinning = pinning
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.counters = EngineCounters()
        self._repriced_for: int | None = None

    @property
    def pinning(self) -> PinningController | None:
        return self._pinning.controller if self._pinning is not None else None

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: SimRequest, now: float) -> None:
        request.queue_place = now
        if self._pinning is not None:
            controller = self._pinning.controller
            controller.on_arrival(request.program_id, now)
            if self._pinning.program_fcfs:
                request.queue_place = controller.queue_time(request.program_id, now)
        self._enqueue(request)

    def _enqueue(self, request: SimRequest, front: bool = False) -> None:
        """vLLM's waiting queue: by arrival time (a program's first arrival under
        program FCFS) when it schedules by priority, else in arrival order with
        preempted requests first."""
        if self._pinning is not None:
            keys = [(waiting.queue_place, waiting.request_id) for waiting in self.waiting]
            index = bisect.bisect(keys, (request.queue_place, request.request_id))
            self.waiting.insert(index, request)
        elif front:
            self.waiting.insert(0, request)
        else:
            self.waiting.append(request)

    def turn_ended(self, program_id: str, tool: str | None, now: float) -> None:
        """The front end parsed the finished turn: it called `tool`."""
        if self._pinning is None:
            return
        cost = self._holding_cost(program_id)
        self._release(self._pinning.controller.on_turn_ended(program_id, tool, now, cost))

    def end_program(self, program_id: str, now: float) -> None:
        if self._pinning is not None:
            self._release(self._pinning.controller.end_program(program_id, now))

    def release_moved(self, program_id: str, now: float) -> None:
        """The router sent the program's next turn elsewhere."""
        if self._pinning is not None:
            self._release(self._pinning.controller.release_moved(program_id, now))

    def step(self, now: float, slowdown: float = 1.0) -> StepResult:
        """One scheduler step from `now`: what it computed, how long it took (its
        modelled time times `slowdown`) and the requests that finished with it."""
        if self._pinning is not None:
            self._before_schedule(now)
        scheduled, preempted = self._schedule(now)
        if self._pinning is not None:
            self._after_schedule(scheduled, preempted, now)
        work = StepWork(
            prefills=tuple(
                (entry.tokens, entry.request.computed) for entry in scheduled if not entry.decode
            ),
            decodes=tuple(entry.request.tokens for entry in scheduled if entry.decode),
            drafts=sum(entry.drafts for entry in scheduled),
        )
        seconds = self._step_time.seconds(work) * slowdown if scheduled else 0.0
        end = now + seconds
        finished = []
        for entry in scheduled:
            request = entry.request
            if entry.decode:
                accepted = (
                    self._drafts.verify(request, entry.drafts)
                    if self._drafts is not None and entry.drafts
                    else 0
                )
                request.computed += 1 + accepted
                request.generated += accepted
            else:
                self.counters.prompt_tokens_computed += entry.tokens
                request.computed += entry.tokens
            self._name_full_blocks(request)
            if request.computed < request.tokens:
                continue
            request.generated += 1
            if request.first_token_at is None:
                request.first_token_at = end
            if request.generated >= request.output_tokens:
                self._finish(request, end)
                finished.append(request)
        self.counters.steps += 1
        self.counters.busy_s += seconds
        return StepResult(len(scheduled), seconds, finished)

    def _schedule(self, now: float) -> tuple[list[_Scheduled], bool]:
        budget = self.settings.max_batched_tokens
        scheduled: list[_Scheduled] = []
        preempted = False
        proposals: dict[int, int] = {}
        if self._drafts is not None:
            decoding = [r for r in self.running if r.tokens - r.computed == 1]
            proposals = self._drafts.proposals(decoding, len(self.running))
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(request.tokens - request.computed, budget)
            decode = request.tokens - request.computed == 1
            drafts = min(proposals.get(request.request_id, 0), budget - 1) if decode else 0
            while not self._grow(request, request.computed + tokens + drafts):
                victim = self._victim()
                position = self.running.index(victim)
                for entry in scheduled:
                    if entry.request is victim:
                        scheduled.remove(entry)
                        budget += entry.tokens + entry.drafts
                        break
                self._preempt(victim)
                preempted = True
                if position < index:
                    index -= 1
                if victim is request:
                    break
            else:
                scheduled.append(_Scheduled(request, tokens, decode, drafts))
                budget -= tokens + drafts
                index += 1
        if preempted:
            return scheduled, True
        while self.waiting and budget > 0 and len(self.running) < self.settings.max_num_seqs:
            request = self.waiting[0]
            admitted = self._admit(request, budget, now)
            if admitted is None:
                break
            self.waiting.pop(0)
            self.running.append(request)
            scheduled.append(
                _Scheduled(request, admitted, decode=admitted == 1 and request.generated > 0)
            )
            budget -= admitted
        return scheduled, False

    def _admit(self, request: SimRequest, budget: int, now: float) -> int | None:
        """Give the request its cached prefix and blocks for up to `budget` new
        tokens; the tokens it computes this step, or None when blocks are short."""
        size = self.settings.block_size
        hit = self.pool.cached_prefix(request.program_id, (request.tokens - 1) // size)
        hit_tokens = len(hit) * size
        tokens = min(request.tokens - hit_tokens, budget)
        new_blocks = math.ceil((hit_tokens + tokens) / size) - len(hit)
        # vLLM admits a prompt only when all of it fits (`scheduler_reserve_full_isl`),
        # not just its first chunk.
        whole_prompt = math.ceil(request.tokens / size) - len(hit)
        if self.pool.free - self.pool.unreferenced(hit) < whole_prompt:
            return None
        self.pool.take(hit)
        allocated = self.pool.allocate(new_blocks)
        assert allocated is not None
        request.blocks = hit + allocated
        request.computed = hit_tokens
        request.named_blocks = len(hit)
        self.counters.prompt_tokens += request.tokens
        self.counters.prompt_tokens_cached += hit_tokens
        if not request.admitted:
            request.admitted = True
            request.cached_tokens = hit_tokens
            if self._pinning is not None:
                controller = self._pinning.controller
                self._release(controller.on_admitted(request.program_id, now, hit_tokens))
        return tokens

    def _grow(self, request: SimRequest, tokens: int) -> bool:
        needed = math.ceil(tokens / self.settings.block_size) - len(request.blocks)
        if needed <= 0:
            return True
        allocated = self.pool.allocate(needed)
        if allocated is None:
            return False
        request.blocks += allocated
        return True

    def _victim(self) -> SimRequest:
        """vLLM's choice: the lowest priority (latest place) under priority
        scheduling, else the last admitted."""
        if self._pinning is not None:
            return max(self.running, key=lambda request: (request.queue_place, request.request_id))
        return self.running[-1]

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self.pool.release(reversed(request.blocks))
        request.blocks = []
        request.computed = 0
        request.named_blocks = 0
        request.preemptions += 1
        self.counters.preemptions += 1
        self._enqueue(request, front=True)

    def _name_full_blocks(self, request: SimRequest) -> None:
        full = request.computed // self.settings.block_size
        for index in range(request.named_blocks, full):
            self.pool.cache(request.blocks[index], (request.program_id, index))
        request.named_blocks = max(request.named_blocks, full)

    def _finish(self, request: SimRequest, now: float) -> None:
        request.finished_at = now
        self.running.remove(request)
        if self._drafts is not None:
            self._drafts.forget(request)
        if self._pinning is not None:
            named = [
                block_id
                for block_id in request.blocks[: request.named_blocks]
                if self.pool.block(block_id).key is not None
            ]
            pin_now, released = self._pinning.controller.on_finished(
                request.program_id, named, request.tokens, now, request.last_step
            )
            self._release(released)
            if pin_now:
                self.pool.take(named)
        self.pool.release(reversed(request.blocks))
        request.blocks = []

    # The pinning scheduler extension's calls, as deployments/engine/pinning does them.

    def _before_schedule(self, now: float) -> None:
        assert self._pinning is not None
        controller = self._pinning.controller
        self._release(controller.expire(now))
        running_reserve = len(self.running)
        self._unpin_until_free(running_reserve, now)
        if self.waiting:
            self._admission_rule(self.waiting[0], running_reserve, now)

    def _after_schedule(self, scheduled: list[_Scheduled], preempted: bool, now: float) -> None:
        assert self._pinning is not None
        if preempted:
            self._release(self._pinning.controller.relieve_pressure(now=now))
        if not scheduled and self.waiting:
            self._unpin_until_free(self._blocks_to_admit(self.waiting[0]), now)

    def _admission_rule(self, head: SimRequest, running_reserve: int, now: float) -> None:
        assert self._pinning is not None
        controller = self._pinning.controller
        if self.pool.free >= running_reserve + self._blocks_of(head):
            return
        needed = running_reserve + self._blocks_to_admit(head)
        if self.pool.free >= needed:
            return
        self._unpin_until_free(needed, now, queued_after=self._queue_place(head))
        if self.pool.free < needed and head.request_id != self._repriced_for:
            self._repriced_for = head.request_id
            waiting_blocks = self._waiting_blocks()
            costs = {
                pin.program_id: self._holding_cost(pin.program_id, waiting_blocks)
                for pin in controller.pins
            }
            self._release(controller.reprice(now, costs))

    def _queue_place(self, request: SimRequest) -> float:
        assert self._pinning is not None
        if self._pinning.program_fcfs:
            return request.queue_place
        first = self._pinning.controller.first_arrival(request.program_id)
        return request.queue_place if first is None else first

    def _blocks_of(self, request: SimRequest) -> int:
        return math.ceil((request.tokens + 1) / self.settings.block_size)

    def _blocks_to_admit(self, request: SimRequest) -> int:
        size = self.settings.block_size
        hit = self.pool.cached_prefix(request.program_id, (request.tokens - 1) // size)
        held = sum(1 for block_id in hit if self.pool.block(block_id).refs > 0)
        return self._blocks_of(request) - held

    def _waiting_blocks(self) -> int:
        size = self.settings.block_size
        return sum(math.ceil(request.tokens / size) for request in self.waiting)

    def _holding_cost(self, program_id: str, waiting_blocks: int | None = None) -> float:
        assert self._pinning is not None
        return holding_cost(
            free_blocks=self.pool.free,
            waiting_blocks=self._waiting_blocks() if waiting_blocks is None else waiting_blocks,
            own_blocks=self._pinning.controller.pinned_blocks_of(program_id),
            charge_withheld_cache=self._pinning.charge_withheld_cache,
        )

    def _unpin_until_free(self, blocks: int, now: float, queued_after: float | None = None) -> None:
        assert self._pinning is not None
        controller = self._pinning.controller
        while controller.pinned_blocks and self.pool.free < blocks:
            released = controller.relieve_pressure(queued_after, now)
            if not released:
                return
            self._release(released)

    def _release(self, pins: list[Pin]) -> None:
        for pin in pins:
            self.pool.release(reversed(pin.blocks))

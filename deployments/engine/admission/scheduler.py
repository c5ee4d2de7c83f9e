"""vLLM scheduler extension: a waiting sequence's prefill starts only when its
KV demand fits the cell budget beside the sequences already running (vLLM's
own check is only that this step's blocks are free; decoding sequences then
preempt each other when the pool runs out). Mixed into every toolserve
scheduler; without its settings in `additional_config` it does nothing."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from cluster.policies.cell_budget import CellBudget, cell_demand
from deployments.engine.admission.settings import from_additional_config


class CellBudgetMixin:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base: Scheduler = self
        config = from_additional_config(base.vllm_config.additional_config)
        self._output_reserve = config.output_reserve_tokens if config else 0
        self._budget = (
            CellBudget(
                pool_cells=base.kv_cache_manager.block_pool.num_gpu_blocks * base.block_size,
                share=config.kv_share,
            )
            if config is not None
            else None
        )
        # Demand of each running sequence, counted when its prefill started.
        self._admitted: dict[str, int] = {}
        self._starting: dict[str, int] = {}
        self._holding = False
        self._held_steps = 0

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self._starting.clear()
        self._holding = False
        output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        for new_request in output.scheduled_new_reqs:
            demand = self._starting.get(new_request.req_id)
            if demand is not None:
                self._admitted[new_request.req_id] = demand
        if self._holding:
            self._held_steps += 1
        return output

    def admission_stats(self) -> dict[str, int]:
        """Steps that held a sequence back since the last call."""
        held, self._held_steps = self._held_steps, 0
        return {"held_steps": held}

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        ready: bool = super()._handle_blocked_waiting_request(request)  # type: ignore[misc]
        if not ready or self._budget is None or not self._starts_fresh(request):
            return ready
        if self._holding:
            return False  # first come, first served: nothing overtakes a held sequence
        base: Scheduler = self
        _, cached_tokens, _ = base.kv_cache_manager.get_computed_blocks(request)
        demand = cell_demand(request.num_prompt_tokens, cached_tokens, self._output_tokens(request))
        running = [r.request_id for r in base.running]
        committed = sum(self._admitted.get(request_id, 0) for request_id in running)
        committed += sum(self._starting.values())
        if self._budget.admits(demand, committed, len(running) + len(self._starting)):
            self._starting[request.request_id] = demand
            return True
        self._holding = True
        return False

    @staticmethod
    def _starts_fresh(request: Request) -> bool:
        """A sequence that has computed nothing and holds nothing (a preempted one
        resumes whatever the budget: it was admitted once)."""
        return bool(request.status == RequestStatus.WAITING and request.num_computed_tokens == 0)

    def _output_tokens(self, request: Request) -> int:
        base: Scheduler = self
        max_model_len: int = base.max_model_len
        allowance: int = request.max_tokens if request.max_tokens is not None else max_model_len
        prompt_tokens: int = request.num_prompt_tokens
        return min(allowance, self._output_reserve, max_model_len - prompt_tokens)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        self._admitted.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

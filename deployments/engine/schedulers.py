"""The schedulers vLLM loads by name inside the EngineCore process
(`scheduler_cls`, chosen by `setup.scheduler_class`): each mechanism's mixin
composed over vLLM's Scheduler or AsyncScheduler. The prompt-lookup gate comes
first, pinning before admission; admission is in every one (inert without its
settings in `additional_config`)."""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from deployments.engine.admission.scheduler import CellBudgetMixin
from deployments.engine.pinning.scheduler import PinningSchedulerMixin
from deployments.engine.prompt_lookup.scheduler import PromptLookupGateMixin


class AdmissionScheduler(CellBudgetMixin, Scheduler):  # type: ignore[misc]
    pass


class AdmissionAsyncScheduler(CellBudgetMixin, AsyncScheduler):  # type: ignore[misc]
    pass


class PinningScheduler(PinningSchedulerMixin, CellBudgetMixin, Scheduler):  # type: ignore[misc]
    pass


class PinningAsyncScheduler(PinningSchedulerMixin, CellBudgetMixin, AsyncScheduler):  # type: ignore[misc]
    pass


class GatedScheduler(PromptLookupGateMixin, CellBudgetMixin, Scheduler):  # type: ignore[misc]
    pass


class GatedPinningScheduler(
    PromptLookupGateMixin,
    PinningSchedulerMixin,
    CellBudgetMixin,
    Scheduler,  # type: ignore[misc]
):
    pass

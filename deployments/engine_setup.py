"""vLLM's engine arguments and configuration for a replica: the deployment's
engine settings, plus pinning's, prompt lookup's, admission's and the KV
offload connector's, and the scheduler class that carries them inside the
EngineCore process."""

from __future__ import annotations

import os
from typing import Any

from cluster.config import AdmissionConfig, KvOffloadConfig, PromptLookupConfig
from deployments import kv_offload as kv_offload_settings
from deployments.admission import settings as admission_settings
from deployments.pinning.settings import EnginePinningSettings
from deployments.prompt_lookup import settings as prompt_lookup_settings

_PINNING_SCHEDULERS = "deployments.pinning.scheduler"
_GATED_SCHEDULERS = "deployments.prompt_lookup.scheduler"
_ADMISSION_SCHEDULERS = "deployments.admission.scheduler"


def create_engine_config(
    engine_kwargs: dict[str, Any],
    pinning: EnginePinningSettings | None,
    prompt_lookup: PromptLookupConfig | None = None,
    admission: AdmissionConfig | None = None,
    kv_offload: KvOffloadConfig | None = None,
    **more: Any,
) -> tuple[Any, Any]:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    pinning_kwargs = pinning.engine_kwargs() if pinning is not None else {}
    lookup_kwargs = (
        prompt_lookup_settings.engine_kwargs(prompt_lookup) if prompt_lookup is not None else {}
    )
    if prompt_lookup is not None:
        # The engine's processes, started after this, inherit it.
        os.environ.update(prompt_lookup_settings.process_environment(prompt_lookup))
    admission_kwargs = admission_settings.engine_kwargs(admission) if admission is not None else {}
    additional_config = (
        pinning_kwargs.pop("additional_config", {})
        | lookup_kwargs.pop("additional_config", {})
        | admission_kwargs.pop("additional_config", {})
    )
    if additional_config:
        more["additional_config"] = additional_config
    transfer_kwargs = (
        kv_offload_settings.kv_transfer_kwargs(kv_offload) if kv_offload is not None else None
    )
    if transfer_kwargs is not None:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            raise ValueError("kv_offload: LMCache does not run on vLLM's CPU backend")
        more["kv_transfer_config"] = KVTransferConfig(**transfer_kwargs)
    engine_args = AsyncEngineArgs(**engine_kwargs, **pinning_kwargs, **lookup_kwargs, **more)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    select_scheduler(vllm_config, pinning, prompt_lookup, admission)
    return engine_args, vllm_config


def select_scheduler(
    vllm_config: Any,
    pinning: EnginePinningSettings | None,
    prompt_lookup: PromptLookupConfig | None = None,
    admission: AdmissionConfig | None = None,
) -> None:
    """Point the engine at the scheduler that carries what is on, matching vLLM's
    own choice of synchronous or asynchronous scheduling where it has one (known
    only once the config exists); prompt lookup's gate schedules synchronously.
    Every toolserve scheduler carries admission, which acts only when its
    settings are in the engine's `additional_config`."""
    pinning_on = pinning is not None and pinning.enabled
    gated = prompt_lookup is not None and prompt_lookup.enabled
    admitting = admission is not None and admission.enabled
    scheduler_config = vllm_config.scheduler_config
    asynchronous = "Async" if scheduler_config.async_scheduling else ""
    if gated:
        name = "GatedPinningScheduler" if pinning_on else "GatedScheduler"
        scheduler_config.scheduler_cls = f"{_GATED_SCHEDULERS}.{name}"
    elif pinning_on:
        scheduler_config.scheduler_cls = f"{_PINNING_SCHEDULERS}.Pinning{asynchronous}Scheduler"
    elif admitting:
        scheduler_config.scheduler_cls = f"{_ADMISSION_SCHEDULERS}.Admission{asynchronous}Scheduler"

"""vLLM's engine arguments and configuration for a replica: the deployment's
engine settings, plus pinning's, prompt lookup's, admission's and the KV
offload connector's, and the scheduler class that carries them inside the
EngineCore process."""

from __future__ import annotations

import os
from typing import Any

from cluster.config import AdmissionConfig, KvOffloadConfig, PromptLookupConfig
from deployments.engine import kv_offload as kv_offload_settings
from deployments.engine.admission import settings as admission_settings
from deployments.engine.pinning.settings import EnginePinningSettings
from deployments.engine.prompt_lookup import settings as prompt_lookup_settings

_SCHEDULERS = "deployments.engine.schedulers"


def engine_arguments(
    engine_kwargs: dict[str, Any],
    pinning: EnginePinningSettings | None,
    prompt_lookup: PromptLookupConfig | None = None,
    admission: AdmissionConfig | None = None,
) -> dict[str, Any]:
    """AsyncEngineArgs of a replica's engine: the deployment's, plus pinning's,
    prompt lookup's and admission's (the scheduler class is chosen once the
    engine's configuration exists, the KV offload connector is an object)."""
    pinning_kwargs = pinning.engine_kwargs() if pinning is not None else {}
    lookup_kwargs = (
        prompt_lookup_settings.engine_kwargs(prompt_lookup) if prompt_lookup is not None else {}
    )
    admission_kwargs = admission_settings.engine_kwargs(admission) if admission is not None else {}
    additional_config = (
        pinning_kwargs.pop("additional_config", {})
        | lookup_kwargs.pop("additional_config", {})
        | admission_kwargs.pop("additional_config", {})
    )
    arguments = engine_kwargs | pinning_kwargs | lookup_kwargs | admission_kwargs
    if additional_config:
        arguments["additional_config"] = additional_config
    return arguments


def engine_environment(prompt_lookup: PromptLookupConfig | None) -> dict[str, str]:
    """What a replica adds to its engine processes' environment."""
    return prompt_lookup.process_environment() if prompt_lookup is not None else {}


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

    # The engine's processes, started after this, inherit it.
    os.environ.update(engine_environment(prompt_lookup))
    transfer_kwargs = (
        kv_offload_settings.kv_transfer_kwargs(kv_offload) if kv_offload is not None else None
    )
    if transfer_kwargs is not None:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            raise ValueError("kv_offload: LMCache does not run on vLLM's CPU backend")
        more["kv_transfer_config"] = KVTransferConfig(**transfer_kwargs)
    engine_args = AsyncEngineArgs(
        **engine_arguments(engine_kwargs, pinning, prompt_lookup, admission), **more
    )
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
    scheduler_config = vllm_config.scheduler_config
    name = scheduler_class(
        pinning_on=pinning is not None and pinning.enabled,
        gated=prompt_lookup is not None and prompt_lookup.enabled,
        admitting=admission is not None and admission.enabled,
        asynchronous=scheduler_config.async_scheduling,
    )
    if name is not None:
        scheduler_config.scheduler_cls = name


def scheduler_class(
    pinning_on: bool, gated: bool, admitting: bool, asynchronous: bool
) -> str | None:
    """The toolserve scheduler that carries what is on; None: vLLM's own."""
    prefix = "Async" if asynchronous else ""
    if gated:
        return f"{_SCHEDULERS}.{'GatedPinningScheduler' if pinning_on else 'GatedScheduler'}"
    if pinning_on:
        return f"{_SCHEDULERS}.Pinning{prefix}Scheduler"
    if admitting:
        return f"{_SCHEDULERS}.Admission{prefix}Scheduler"
    return None

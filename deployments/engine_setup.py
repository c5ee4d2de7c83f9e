"""vLLM's engine arguments and configuration for a replica: the deployment's
engine settings, plus pinning's and prompt lookup's, and the scheduler class
that carries them inside the EngineCore process."""

from __future__ import annotations

from typing import Any

from cluster.config import PromptLookupConfig
from deployments.pinning.settings import EnginePinningSettings
from deployments.prompt_lookup import settings as prompt_lookup_settings

_PINNING_SCHEDULERS = "deployments.pinning.scheduler"
_GATED_SCHEDULERS = "deployments.prompt_lookup.scheduler"


def create_engine_config(
    engine_kwargs: dict[str, Any],
    pinning: EnginePinningSettings | None,
    prompt_lookup: PromptLookupConfig | None = None,
    **more: Any,
) -> tuple[Any, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    pinning_kwargs = pinning.engine_kwargs() if pinning is not None else {}
    lookup_kwargs = (
        prompt_lookup_settings.engine_kwargs(prompt_lookup) if prompt_lookup is not None else {}
    )
    additional_config = pinning_kwargs.pop("additional_config", {}) | lookup_kwargs.pop(
        "additional_config", {}
    )
    if additional_config:
        more["additional_config"] = additional_config
    engine_args = AsyncEngineArgs(**engine_kwargs, **pinning_kwargs, **lookup_kwargs, **more)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    select_scheduler(vllm_config, pinning, prompt_lookup)
    return engine_args, vllm_config


def select_scheduler(
    vllm_config: Any,
    pinning: EnginePinningSettings | None,
    prompt_lookup: PromptLookupConfig | None = None,
) -> None:
    """Point the engine at the scheduler that carries what is on, matching vLLM's
    own choice of synchronous or asynchronous scheduling where it has one (known
    only once the config exists); prompt lookup's gate schedules synchronously."""
    pinning_on = pinning is not None and pinning.enabled
    gated = prompt_lookup is not None and prompt_lookup.enabled
    scheduler_config = vllm_config.scheduler_config
    if gated:
        name = "GatedPinningScheduler" if pinning_on else "GatedScheduler"
        scheduler_config.scheduler_cls = f"{_GATED_SCHEDULERS}.{name}"
    elif pinning_on:
        name = "PinningAsyncScheduler" if scheduler_config.async_scheduling else "PinningScheduler"
        scheduler_config.scheduler_cls = f"{_PINNING_SCHEDULERS}.{name}"

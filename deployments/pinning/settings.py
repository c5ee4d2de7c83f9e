"""What a replica hands its engine process about pinning, and the engine arguments for it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cluster.config import PinningConfig

ADDITIONAL_CONFIG_KEY = "toolserve_pinning"
_SCHEDULER_MODULE = "deployments.pinning.scheduler"


class EnginePinningSettings(PinningConfig):
    """The deployment's pinning configuration plus where this engine publishes pins."""

    replica_id: str = Field(description="Replica that owns this engine's pins in the ledger.")
    redis_url: str | None = Field(
        default=None, description="Redis holding the TTL ledger; None publishes nothing."
    )

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> EnginePinningSettings | None:
        if not isinstance(additional_config, dict):
            return None
        raw = additional_config.get(ADDITIONAL_CONFIG_KEY)
        return None if raw is None else cls.model_validate(raw)

    def engine_kwargs(self) -> dict[str, Any]:
        """AsyncEngineArgs that turn pinning on (the scheduler class is chosen later)."""
        if not self.enabled:
            return {}
        return {
            "scheduling_policy": "priority" if self.program_fcfs else "fcfs",
            "additional_config": {ADDITIONAL_CONFIG_KEY: self.model_dump(mode="json")},
        }


def create_engine_config(
    engine_kwargs: dict[str, Any], pinning: EnginePinningSettings | None, **more: Any
) -> tuple[Any, Any]:
    """vLLM's engine arguments and configuration, with the pinning scheduler when pinning is on."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    pinning_kwargs = pinning.engine_kwargs() if pinning is not None else {}
    engine_args = AsyncEngineArgs(**engine_kwargs, **pinning_kwargs, **more)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    if pinning is not None:
        select_scheduler(vllm_config, pinning)
    return engine_args, vllm_config


def select_scheduler(vllm_config: Any, settings: EnginePinningSettings) -> None:
    """Point the engine at the pinning scheduler matching vLLM's own choice of
    synchronous or asynchronous scheduling (known only once the config exists)."""
    if not settings.enabled:
        return
    scheduler_config = vllm_config.scheduler_config
    name = "PinningAsyncScheduler" if scheduler_config.async_scheduling else "PinningScheduler"
    scheduler_config.scheduler_cls = f"{_SCHEDULER_MODULE}.{name}"

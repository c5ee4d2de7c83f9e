"""What a replica hands its engine process about pinning, and the engine arguments for it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cluster.config import PinningConfig
from deployments.engine.additional_config import carried, read

ADDITIONAL_CONFIG_KEY = "toolserve_pinning"


class EnginePinningSettings(PinningConfig):
    """The deployment's pinning configuration plus where this engine publishes pins."""

    replica_id: str = Field(description="Replica that owns this engine's pins in the ledger.")
    redis_url: str | None = Field(
        default=None, description="Redis holding the TTL ledger; None publishes nothing."
    )
    offload_reload_bytes_per_s: float | None = Field(
        default=None,
        description="With a CPU tier under the KV cache: the rate a lost pin's "
        "context is copied back at, which the cost model prices instead of a prefill.",
    )

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> EnginePinningSettings | None:
        return read(additional_config, ADDITIONAL_CONFIG_KEY, cls)

    def engine_kwargs(self) -> dict[str, Any]:
        """AsyncEngineArgs that turn pinning on (the scheduler class is chosen later)."""
        if not self.enabled:
            return {}
        return {
            "scheduling_policy": "priority" if self.program_fcfs else "fcfs",
            "additional_config": carried(ADDITIONAL_CONFIG_KEY, self),
        }

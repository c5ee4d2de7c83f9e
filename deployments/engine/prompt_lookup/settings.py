"""What a replica hands its engine about prompt-lookup decoding, and the engine
arguments for it."""

from __future__ import annotations

from typing import Any

from cluster.config import PromptLookupConfig
from deployments.engine.additional_config import carried, read

ADDITIONAL_CONFIG_KEY = "toolserve_prompt_lookup"


def from_additional_config(additional_config: Any) -> PromptLookupConfig | None:
    return read(additional_config, ADDITIONAL_CONFIG_KEY, PromptLookupConfig)


def engine_kwargs(config: PromptLookupConfig) -> dict[str, Any]:
    """AsyncEngineArgs for vLLM's n-gram drafts and the gate's settings (the gate's
    scheduler is chosen later)."""
    if not config.enabled:
        return {}
    return config.engine_kwargs() | {"additional_config": carried(ADDITIONAL_CONFIG_KEY, config)}

"""What a replica hands its engine process about cell-budget admission."""

from __future__ import annotations

from typing import Any

from cluster.config import AdmissionConfig

ADDITIONAL_CONFIG_KEY = "toolserve_admission"


def engine_kwargs(config: AdmissionConfig) -> dict[str, Any]:
    """AsyncEngineArgs that turn admission on (the scheduler class is chosen later)."""
    if not config.enabled:
        return {}
    return {"additional_config": {ADDITIONAL_CONFIG_KEY: config.model_dump(mode="json")}}


def from_additional_config(additional_config: Any) -> AdmissionConfig | None:
    if not isinstance(additional_config, dict):
        return None
    raw = additional_config.get(ADDITIONAL_CONFIG_KEY)
    return None if raw is None else AdmissionConfig.model_validate(raw)

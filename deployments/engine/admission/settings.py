"""What a replica hands its engine process about cell-budget admission."""

from __future__ import annotations

from typing import Any

from cluster.config import AdmissionConfig
from deployments.engine.additional_config import carried, read

ADDITIONAL_CONFIG_KEY = "toolserve_admission"


def engine_kwargs(config: AdmissionConfig) -> dict[str, Any]:
    """AsyncEngineArgs that turn admission on (the scheduler class is chosen later)."""
    if not config.enabled:
        return {}
    return {"additional_config": carried(ADDITIONAL_CONFIG_KEY, config)}


def from_additional_config(additional_config: Any) -> AdmissionConfig | None:
    return read(additional_config, ADDITIONAL_CONFIG_KEY, AdmissionConfig)

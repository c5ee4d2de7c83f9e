"""toolserve's settings carried to the EngineCore process in vLLM's
`additional_config`, one key per mechanism (pinning, prompt lookup, admission)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

_Settings = TypeVar("_Settings", bound=BaseModel)


def carried(key: str, settings: BaseModel) -> dict[str, Any]:
    """The `additional_config` entry that carries `settings` under `key`."""
    return {key: settings.model_dump(mode="json")}


def read(additional_config: Any, key: str, model: type[_Settings]) -> _Settings | None:
    """The settings carried under `key`, or None when the engine was not given any."""
    if not isinstance(additional_config, dict):
        return None
    raw = additional_config.get(key)
    return None if raw is None else model.model_validate(raw)

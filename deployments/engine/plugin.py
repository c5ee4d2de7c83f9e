"""vLLM general plugin (entry point `vllm.general_plugins`): lets a replica reach
toolserve's scheduler inside the EngineCore process through vLLM's utility calls
(`engine_core.call_utility_async("toolserve_pinning_control", operation, arguments)`,
`call_utility_async("toolserve_prompt_lookup_stats")`, `"toolserve_admission_stats"`,
`"toolserve_add_predicted_calls"`), and corrects vLLM's CPU sampling kernel for
drafted tokens (`cpu_kernels`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

UTILITY_METHOD = "toolserve_pinning_control"
PROMPT_LOOKUP_STATS_METHOD = "toolserve_prompt_lookup_stats"
ADMISSION_STATS_METHOD = "toolserve_admission_stats"
PREDICTED_CALLS_METHOD = "toolserve_add_predicted_calls"


class EngineOperation(StrEnum):
    """What a replica asks of its engine's pinning scheduler; arguments in order."""

    TURN_ENDED = "turn_ended"
    """program id, name of the tool the turn called (or None)"""
    END_PROGRAM = "end_program"
    """program id"""
    RELEASE_PIN = "release_pin"
    """program id (the router moved the program to another replica)"""
    SET_PREFILL_PROFILE = "set_prefill_profile"
    """the fitted profile's a, b, c"""
    STATS = "stats"
    """none; returns the scheduler's stats since the last call"""


def _pinning_control(engine_core: Any, operation: str, arguments: list[Any]) -> Any:
    control = getattr(engine_core.scheduler, "pinning_control", None)
    if control is None:
        raise RuntimeError("this engine does not run toolserve's pinning scheduler")
    return control(operation, arguments)


def _scheduler_stats(engine_core: Any, method: str, missing: str) -> Any:
    stats = getattr(engine_core.scheduler, method, None)
    if stats is None:
        raise RuntimeError(missing)
    return stats()


def _prompt_lookup_stats(engine_core: Any) -> Any:
    return _scheduler_stats(
        engine_core, "prompt_lookup_stats", "this engine does not gate prompt-lookup drafts"
    )


def _admission_stats(engine_core: Any) -> Any:
    return _scheduler_stats(
        engine_core, "admission_stats", "this engine does not run toolserve's scheduler"
    )


def _add_predicted_calls(engine_core: Any, program_id: str, call_texts: list[str]) -> Any:
    add = getattr(engine_core.scheduler, "add_predicted_calls", None)
    if add is None:
        raise RuntimeError("this engine does not draft from predicted calls")
    return add(program_id, call_texts)


def register() -> None:
    from vllm.v1.engine.core import EngineCore

    from deployments.engine.cpu_kernels import install

    install()

    if not hasattr(EngineCore, UTILITY_METHOD):
        setattr(EngineCore, UTILITY_METHOD, _pinning_control)
    if not hasattr(EngineCore, PROMPT_LOOKUP_STATS_METHOD):
        setattr(EngineCore, PROMPT_LOOKUP_STATS_METHOD, _prompt_lookup_stats)
    if not hasattr(EngineCore, ADMISSION_STATS_METHOD):
        setattr(EngineCore, ADMISSION_STATS_METHOD, _admission_stats)
    if not hasattr(EngineCore, PREDICTED_CALLS_METHOD):
        setattr(EngineCore, PREDICTED_CALLS_METHOD, _add_predicted_calls)

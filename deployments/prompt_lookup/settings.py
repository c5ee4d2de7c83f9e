"""What a replica hands its engine about prompt-lookup decoding, and the engine
arguments for it."""

from __future__ import annotations

from typing import Any

from cluster.config import PromptLookupConfig
from deployments.additional_config import carried, read

ADDITIONAL_CONFIG_KEY = "toolserve_prompt_lookup"


def from_additional_config(additional_config: Any) -> PromptLookupConfig | None:
    return read(additional_config, ADDITIONAL_CONFIG_KEY, PromptLookupConfig)


def engine_kwargs(config: PromptLookupConfig) -> dict[str, Any]:
    """AsyncEngineArgs for vLLM's n-gram drafts (the gate's scheduler is chosen later)."""
    if not config.enabled:
        return {}
    return {
        # Drafts are gated per request between steps, which vLLM's asynchronous
        # scheduling (it schedules the next step before drafts exist) rules out.
        "async_scheduling": False,
        "speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": config.window,
            "prompt_lookup_min": config.min_match,
            "prompt_lookup_max": config.max_match,
        },
        "additional_config": carried(ADDITIONAL_CONFIG_KEY, config),
    }


def process_environment(config: PromptLookupConfig) -> dict[str, str]:
    """Environment the engine's processes need for n-gram drafts."""
    if not config.enabled:
        return {}
    # vLLM's n-gram proposer is a numba `parallel=True` function. Without TBB,
    # numba's first parallel call starts its OpenMP layer in the worker, which
    # sets the process's OpenMP thread count to numba's default there (1: the
    # worker's main thread is pinned to one core), and torch's kernels share
    # that libgomp: every forward pass after the first draft ran on one thread.
    # numba's own thread pool leaves OpenMP alone.
    return {"NUMBA_THREADING_LAYER": "workqueue"}

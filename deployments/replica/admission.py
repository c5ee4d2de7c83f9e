"""The replica's side of admission: how often the engine held sequences back,
exported as a metric every few seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployments.engine.plugin import ADMISSION_STATS_METHOD
from deployments.replica.engine_stats import poll_engine_stats

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


async def export_admission_stats(engine: AsyncLLM) -> None:
    from ray.serve.metrics import Counter

    held_steps = Counter(
        "toolserve_admission_held_steps",
        description="Engine steps in which cell-budget admission held a waiting "
        "sequence back (its KV demand did not fit beside the running ones').",
    )

    def record(stats: dict[str, Any]) -> None:
        if stats["held_steps"]:
            held_steps.inc(stats["held_steps"])

    await poll_engine_stats(
        "admission", lambda: engine.engine_core.call_utility_async(ADMISSION_STATS_METHOD), record
    )

"""The replica's side of prompt lookup: the engine's gate counts, exported as
metrics every few seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployments.engine.plugin import PROMPT_LOOKUP_STATS_METHOD
from deployments.replica.engine_stats import poll_engine_stats

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class PromptLookupMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Counter

        by_region = ("region",)
        self._steps = Counter(
            "toolserve_prompt_lookup_steps",
            description="Steps in which a request had prompt-lookup drafts verified, by "
            "where its output was (tool_call, prose).",
            tag_keys=by_region,
        )
        self._drafted = Counter(
            "toolserve_prompt_lookup_drafted_tokens",
            description="Drafts verified, by region.",
            tag_keys=by_region,
        )
        self._accepted = Counter(
            "toolserve_prompt_lookup_accepted_tokens",
            description="Drafts accepted, by region (each verified step also yields one "
            "token of its own: (accepted + steps) / steps tokens per step).",
            tag_keys=by_region,
        )
        by_tool = ("tool",)
        self._predicted_drafted = Counter(
            "toolserve_predicted_call_drafted_tokens",
            description="Drafts taken from a call the turn's speculation predicted, "
            "verified while the request wrote a call, by the predicted call's tool.",
            tag_keys=by_tool,
        )
        self._predicted_accepted = Counter(
            "toolserve_predicted_call_accepted_tokens",
            description="Drafts from a predicted call the engine accepted, by tool.",
            tag_keys=by_tool,
        )
        self._capped = Counter(
            "toolserve_prompt_lookup_capped_steps",
            description="Engine steps with more decoding requests than `max_decoders`: no drafts.",
        )

    def record(self, stats: dict[str, Any]) -> None:
        for region, counts in stats["regions"].items():
            tags = {"region": region}
            for counter, key in (
                (self._steps, "steps"),
                (self._drafted, "drafted"),
                (self._accepted, "accepted"),
            ):
                if counts[key]:
                    counter.inc(counts[key], tags=tags)
        for tool, counts in stats["predicted"].items():
            for counter, key in (
                (self._predicted_drafted, "drafted"),
                (self._predicted_accepted, "accepted"),
            ):
                if counts[key]:
                    counter.inc(counts[key], tags={"tool": tool})
        if stats["capped_steps"]:
            self._capped.inc(stats["capped_steps"])


async def export_prompt_lookup_stats(engine: AsyncLLM) -> None:
    metrics = PromptLookupMetrics()
    await poll_engine_stats(
        "prompt-lookup",
        lambda: engine.engine_core.call_utility_async(PROMPT_LOOKUP_STATS_METHOD),
        metrics.record,
    )

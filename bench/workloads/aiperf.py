"""The conversations AIPerf sends when it drives a system (`bench/peer.py` runs
it): its synthetic multi-turn mode, sized per benchmark size."""

from __future__ import annotations

from pydantic import BaseModel, Field

from bench.workloads.plan import Size, WorkloadPlan

AGENT_TYPE = "aiperf-multi-turn"


class AiperfWorkload(BaseModel):
    """The conversations `aiperf profile` sends (its synthetic multi-turn mode)."""

    conversations: int = Field(gt=0, description="Conversations, each one agent program.")
    turns: int = Field(gt=0, description="Turns per conversation.")
    turn_delay_ms: float = Field(
        ge=0, description="Mean pause between a reply and the next turn (the tool's time)."
    )
    turn_delay_stddev_ms: float = Field(ge=0, description="Spread of that pause.")
    input_tokens: int = Field(gt=0, description="Tokens of each new user message.")
    output_tokens: int = Field(gt=0, description="Tokens asked of each reply (`max_tokens`).")
    concurrency: int = Field(gt=0, description="Conversations in flight at once.")
    seed: int = Field(default=0, description="AIPerf's random seed (same prompts every run).")


def aiperf_multi_turn_plan(size: Size) -> WorkloadPlan:
    if size == "quick":
        peer = AiperfWorkload(
            conversations=6, turns=4, turn_delay_ms=1000, turn_delay_stddev_ms=500,
            input_tokens=64, output_tokens=32, concurrency=6,
        )  # fmt: skip
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Pause between turns: BFCL v4 tool time (Continuum, arXiv 2511.02230, Table 1).
        peer = AiperfWorkload(
            conversations=24, turns=8, turn_delay_ms=1923, turn_delay_stddev_ms=2133,
            input_tokens=64, output_tokens=48, concurrency=12,
        )  # fmt: skip
        kv_cache_mib, max_model_len = 256, 4096
    return WorkloadPlan(
        name="aiperf-multi-turn",
        size=size,
        description=(
            f"AIPerf's synthetic multi-turn conversations, driven by `aiperf profile`: "
            f"{peer.conversations} conversations of {peer.turns} turns, {peer.concurrency} "
            f"at once, {peer.input_tokens} new prompt tokens and {peer.output_tokens} "
            f"generated per turn, {peer.turn_delay_ms:g} ms (sd {peer.turn_delay_stddev_ms:g}) "
            "between turns for the tool, one X-Session-ID per conversation. Not reproduced: "
            "tool calls (AIPerf's synthetic turns are plain chat; it replays tool turns only "
            "from recorded histories, not the server's live replies)"
        ),
        build=lambda seed: [],
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
        peer=peer,
    )

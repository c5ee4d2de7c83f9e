"""The conversations AIPerf sends when it drives a system (`bench/peer.py` runs
it): its synthetic multi-turn mode, sized per benchmark size."""

from __future__ import annotations

from pydantic import BaseModel, Field

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

"""A model turn as the simulated engine serves it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimRequest:
    """One model turn: a prompt of `prompt_tokens`, then `output_tokens` decoded."""

    request_id: int
    program_id: str
    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    tool: str | None = None
    """The tool the reply calls (None: the reply calls none)."""
    last_step: bool = False
    queue_place: float = 0.0
    generated: int = 0
    computed: int = 0
    named_blocks: int = 0
    blocks: list[int] = field(default_factory=list)
    admitted: bool = False
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache at the first admission."""
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated

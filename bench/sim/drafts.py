"""N-gram (prompt-lookup) drafts on the simulated engine, by their rates: a
decoding sequence finds an n-gram of its context to copy on a share of its
steps (`match_rate`) and proposes up to `window` tokens, each accepted, while
those before it were, with the chance `acceptance` (in a tool call, where a
reply copies names and values from its prompt, `call_acceptance`). Stock vLLM
verifies every proposal; toolserve's engine asks its very gate how many each
sequence may have verified. Draws come from one seeded generator."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from bench.sim.request import SimRequest
from cluster.policies.draft_gate import ProposalGate


class DraftRates(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(gt=0, description="Most tokens proposed a step.")
    match_rate: float = Field(ge=0, le=1, description="Share of steps with a proposal.")
    acceptance: float = Field(ge=0, lt=1, description="Chance each proposed token is right.")
    call_acceptance: float = Field(ge=0, lt=1, description="The same within a tool call's text.")
    call_tokens: int = Field(
        default=24,
        ge=0,
        description="Tokens at the end of a calling turn's reply that are its call.",
    )

    @classmethod
    def measured(cls, match_rate: float, accepted_share: float, window: int = 4) -> DraftRates:
        """Rates as a run's counters give them: the share of decoding steps with a
        proposal, the share of proposed tokens accepted (in calls and prose alike)."""
        acceptance = cls.acceptance_for(accepted_share, window)
        return cls(
            window=window,
            match_rate=min(1.0, match_rate),
            acceptance=acceptance,
            call_acceptance=acceptance,
        )

    @staticmethod
    def acceptance_for(accepted_share: float, window: int) -> float:
        """The per-token chance whose expected accepted share of a full window's
        proposal (accepted / proposed) is `accepted_share`."""
        low, high = 0.0, 0.999999
        for _ in range(60):
            middle = (low + high) / 2
            expected = sum(middle**position for position in range(1, window + 1)) / window
            low, high = (middle, high) if expected < accepted_share else (low, middle)
        return low


class NgramDrafts:
    def __init__(self, rates: DraftRates, seed: int, gate: ProposalGate | None = None):
        self.rates = rates
        self._random = random.Random(seed)
        self._gate = gate
        self.drafted = 0
        self.accepted = 0

    def in_call(self, request: SimRequest) -> bool:
        return (
            request.tool is not None
            and request.output_tokens - request.generated <= self.rates.call_tokens
        )

    def proposals(self, decoding: list[SimRequest], running: int) -> dict[int, int]:
        """Tokens each decoding request has verified this step."""
        over_cap = self._gate is not None and self._gate.over_cap(running)
        lengths = {}
        for request in decoding:
            if self._random.random() >= self.rates.match_rate:
                continue
            length = self.rates.window
            if self._gate is not None:
                length = self._gate.draft_length(
                    str(request.request_id), self.in_call(request), over_cap
                )
            left = request.output_tokens - request.generated - 1
            if min(length, left) > 0:
                lengths[request.request_id] = min(length, left)
        return lengths

    def verify(self, request: SimRequest, drafted: int) -> int:
        """How many of the `drafted` tokens were right."""
        in_call = self.in_call(request)
        chance = self.rates.call_acceptance if in_call else self.rates.acceptance
        accepted = 0
        while accepted < drafted and self._random.random() < chance:
            accepted += 1
        self.drafted += drafted
        self.accepted += accepted
        if self._gate is not None:
            self._gate.observe(str(request.request_id), drafted, accepted, in_call)
        return accepted

    def forget(self, request: SimRequest) -> None:
        if self._gate is not None:
            self._gate.forget(str(request.request_id))

"""How long one engine step takes, from the work it does: the prompt tokens it
computes (each attending to the context before it) and the sequences it decodes
(each attending to its whole context)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class StepWork:
    """What one step computed: each prefill chunk as (new tokens, context tokens
    before them), each decoding sequence by its context tokens."""

    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()
    drafts: int = 0
    """Proposed tokens verified beside the decoding sequences' own."""

    def features(self) -> tuple[float, ...]:
        """The step's terms in the order of `StepTimeModel`'s coefficients."""
        new_tokens = sum(new for new, _ in self.prefills)
        attended = sum(new * before + new * new / 2 for new, before in self.prefills)
        return (1.0, new_tokens, attended, len(self.decodes), sum(self.decodes), self.drafts)

    @property
    def idle(self) -> bool:
        return not self.prefills and not self.decodes


class StepTimeModel(BaseModel):
    """Seconds of one step: a fixed cost, then linear in what it computes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_s: float = Field(ge=0, description="Every step's fixed cost (scheduling, sampling).")
    prefill_token_s: float = Field(ge=0, description="Per prompt token computed.")
    prefill_attention_s: float = Field(
        ge=0, description="Per prompt token computed, per context token it attends."
    )
    decode_sequence_s: float = Field(ge=0, description="Per sequence decoding a token.")
    decode_context_s: float = Field(
        ge=0, description="Per context token a decoding sequence attends."
    )
    draft_token_s: float = Field(
        default=0.0, ge=0, description="Per proposed token verified beside a decoding one."
    )

    def seconds(self, work: StepWork) -> float:
        coefficients = (
            self.base_s,
            self.prefill_token_s,
            self.prefill_attention_s,
            self.decode_sequence_s,
            self.decode_context_s,
            self.draft_token_s,
        )
        return sum(c * f for c, f in zip(coefficients, work.features(), strict=True))

    @classmethod
    def fit(cls, steps: Sequence[StepWork], seconds: Sequence[float]) -> StepTimeModel:
        """Least squares over timed steps, each coefficient kept at zero or above
        (a term fitted below zero is dropped and the rest fitted again)."""
        if len(steps) != len(seconds) or len(steps) < 6:
            raise ValueError("a fit needs at least six timed steps")
        features = np.array([step.features() for step in steps], dtype=float)
        target = np.asarray(seconds, dtype=float)
        kept = list(range(features.shape[1]))
        while True:
            solution, *_ = np.linalg.lstsq(features[:, kept], target, rcond=None)
            negative = [kept[index] for index, value in enumerate(solution) if value < 0]
            if not negative:
                break
            kept = [column for column in kept if column not in negative]
        coefficients = [0.0] * features.shape[1]
        for column, value in zip(kept, solution, strict=True):
            coefficients[column] = float(value)
        return cls(
            base_s=coefficients[0],
            prefill_token_s=coefficients[1],
            prefill_attention_s=coefficients[2],
            decode_sequence_s=coefficients[3],
            decode_context_s=coefficients[4],
            draft_token_s=coefficients[5],
        )

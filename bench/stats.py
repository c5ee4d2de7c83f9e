"""Confidence intervals for benchmark figures (pure).

A run has rounds; in each round every system (arm) ran the same programs once,
in a seeded random order. Intervals come from a two-stage bootstrap: rounds are
resampled with replacement, then programs within each chosen round. Comparisons
are paired: a resampled program contributes its JCT on both systems in the same
round, so the machine's drift between rounds and the spread between programs
cancel out of the ratio as far as the data allow.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000

Statistic = Callable[[np.ndarray], float]


def mean(values: np.ndarray) -> float:
    return float(np.mean(values))


def median(values: np.ndarray) -> float:
    return float(np.median(values))


def p90(values: np.ndarray) -> float:
    return float(np.percentile(values, 90))


STATISTICS: dict[str, Statistic] = {"mean": mean, "median": median, "p90": p90}


@dataclass(frozen=True)
class Interval:
    """A figure with its 95% bootstrap interval."""

    estimate: float
    low: float
    high: float

    def excludes(self, value: float) -> bool:
        return value < self.low or value > self.high

    def as_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


def verdict(ratio: Interval) -> str:
    """How a speed-up ratio (reference / system, above 1: the system is faster)
    reads: `faster` or `slower` only when its interval excludes 1.0."""
    if not ratio.excludes(1.0):
        return "not resolved"
    return "faster" if ratio.low > 1.0 else "slower"


def _percentile_interval(estimate: float, samples: list[float]) -> Interval:
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high))


def bootstrap(
    rounds: Sequence[Sequence[float]],
    statistic: Statistic,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Interval | None:
    """`statistic` of all values pooled, with its interval over rounds and the
    values within them. None when there are no values."""
    arrays = [np.asarray(values, dtype=float) for values in rounds if len(values)]
    if not arrays:
        return None
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(resamples):
        chosen = rng.integers(len(arrays), size=len(arrays))
        pooled = np.concatenate(
            [arrays[i][rng.integers(len(arrays[i]), size=len(arrays[i]))] for i in chosen]
        )
        samples.append(statistic(pooled))
    return _percentile_interval(statistic(np.concatenate(arrays)), samples)


@dataclass(frozen=True)
class PairedRatio:
    """Reference's mean over the system's, on the programs both completed in
    each round: above 1 the system is faster."""

    ratio: Interval
    per_round: list[float]
    programs: int

    @property
    def verdict(self) -> str:
        return verdict(self.ratio)

    def as_json(self) -> dict[str, object]:
        return {
            **self.ratio.as_json(),
            "per_round": self.per_round,
            "programs": self.programs,
            "verdict": self.verdict,
        }


def paired_ratio(
    reference: Sequence[Mapping[str, float]],
    system: Sequence[Mapping[str, float]],
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> PairedRatio | None:
    """`reference[r]` and `system[r]` map program id to a figure (JCT) in round r.
    Rounds are resampled with replacement, then the programs both completed within
    each chosen round; the same draw picks both systems' figures."""
    pairs = []
    for reference_round, system_round in zip(reference, system, strict=True):
        shared = sorted(reference_round.keys() & system_round.keys())
        if shared:
            pairs.append(
                (
                    np.array([reference_round[p] for p in shared], dtype=float),
                    np.array([system_round[p] for p in shared], dtype=float),
                )
            )
    if not pairs:
        return None
    per_round = [float(ref.sum() / sys.sum()) for ref, sys in pairs]
    estimate = float(sum(ref.sum() for ref, _ in pairs) / sum(sys.sum() for _, sys in pairs))
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(resamples):
        reference_total = system_total = 0.0
        for i in rng.integers(len(pairs), size=len(pairs)):
            ref, sys = pairs[i]
            picked = rng.integers(len(ref), size=len(ref))
            reference_total += float(ref[picked].sum())
            system_total += float(sys[picked].sum())
        samples.append(reference_total / system_total)
    return PairedRatio(
        _percentile_interval(estimate, samples),
        per_round,
        sum(len(ref) for ref, _ in pairs),
    )


def round_orders(arms: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """Each round's run order: every arm once, shuffled by a generator seeded with
    `seed`, so a run's order is reproducible and no arm always runs first."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(arms)
        rng.shuffle(order)
        orders.append(order)
    return orders

"""Confidence intervals for benchmark figures (pure).

A run has rounds; in each round every system (arm) ran the same programs once,
in a seeded random order. A system's figures (mean, median, p90 JCT) get a
two-stage bootstrap: rounds are resampled with replacement, then programs
within each chosen round.

A comparison of two systems is computed from the rounds: each round gives one
ratio (the reference's total JCT over the system's, on the programs both
completed in that round), and the interval is Student's t on the logarithms of
those ratios. The round is the unit that repeats: programs within a round share
its machine state (what else ran, how the engine laid out its memory), so they
are not independent draws, and resampling them as if they were understates the
noise. An A/A run (one system as two arms) showed it: with a program-level
bootstrap the two identical arms "differed" by 2% [1%, 4%], while the per-round
ratios (0.97, 0.98, 0.99) give an interval that includes 1.0.
"""

from __future__ import annotations

import math
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


# Two-sided 95% quantiles of Student's t by degrees of freedom (1-30); past 30 the
# value for 30 is used, a little wider than the exact one.
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    return _T_975[min(degrees_of_freedom, len(_T_975)) - 1]


@dataclass(frozen=True)
class PairedRatio:
    """Reference's JCT over the system's, round by round, on the programs both
    completed: above 1 the system is faster. `ratio` is the geometric mean of the
    rounds' ratios with its t interval; None with a single round, which cannot
    show how much a run varies (the verdict is then `not resolved`)."""

    ratio: Interval | None
    per_round: list[float]
    programs: int

    @property
    def verdict(self) -> str:
        return verdict(self.ratio) if self.ratio else "not resolved"

    def as_json(self) -> dict[str, object]:
        return {
            **(
                self.ratio.as_json()
                if self.ratio
                else {"estimate": self.per_round[0], "low": None, "high": None}
            ),
            "per_round": self.per_round,
            "programs": self.programs,
            "verdict": self.verdict,
        }


def round_ratio_interval(per_round: Sequence[float]) -> Interval | None:
    """Geometric mean of per-round ratios with a 95% Student-t interval on their
    logarithms; None for fewer than two rounds."""
    logs = mean_interval(np.log(np.asarray(per_round, dtype=float)).tolist())
    if logs is None:
        return None
    return Interval(math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high))


def mean_interval(per_round: Sequence[float]) -> Interval | None:
    """Mean of per-round values (e.g. differences) with a 95% Student-t interval;
    None for fewer than two rounds."""
    if len(per_round) < 2:
        return None
    values = np.asarray(per_round, dtype=float)
    centre = float(values.mean())
    spread = float(values.std(ddof=1)) / math.sqrt(len(values))
    half_width = t_quantile_975(len(values) - 1) * spread
    return Interval(centre, centre - half_width, centre + half_width)


def paired_ratio(
    reference: Sequence[Mapping[str, float]], system: Sequence[Mapping[str, float]]
) -> PairedRatio | None:
    """`reference[r]` and `system[r]` map program id to a figure (JCT) in round r;
    each round's ratio is taken over the programs both completed in it."""
    per_round = []
    programs = 0
    for reference_round, system_round in zip(reference, system, strict=True):
        shared = sorted(reference_round.keys() & system_round.keys())
        if shared:
            per_round.append(
                sum(reference_round[p] for p in shared) / sum(system_round[p] for p in shared)
            )
            programs += len(shared)
    if not per_round:
        return None
    return PairedRatio(round_ratio_interval(per_round), per_round, programs)


@dataclass(frozen=True)
class PooledRatio:
    """One comparison pooled over several runs (days, machines): `ratio` is the
    geometric mean of every run's round ratios with its t interval, the rounds
    taken as exchangeable across runs. `runs_agree` says whether one value lies
    inside every run's own interval (runs of a single round have none and do not
    count against it): where it does not, a day or a machine moves the ratio more
    than rounds do, and the pooled interval is too narrow."""

    ratio: Interval
    rounds: int
    runs_agree: bool

    @property
    def verdict(self) -> str:
        return verdict(self.ratio)


def pooled_round_ratio(
    runs: Sequence[Sequence[float]], intervals: Sequence[Interval | None]
) -> PooledRatio | None:
    """`runs[i]` are run i's per-round ratios and `intervals[i]` its own interval;
    None when the runs hold fewer than two rounds in all."""
    every_round = [ratio for per_round in runs for ratio in per_round]
    pooled = round_ratio_interval(every_round)
    if pooled is None:
        return None
    own = [interval for interval in intervals if interval is not None]
    agree = not own or max(i.low for i in own) <= min(i.high for i in own)
    return PooledRatio(pooled, len(every_round), agree)


def overlap_speedup_bound(whole_s: float, tool_s: float) -> float | None:
    """Conveyor's bound (arXiv 2406.00059, §3.4) on how much sooner a tool's result
    can come when the tool runs while its call is decoded, for one call: a result
    that came `whole_s` after the turn was sent, `tool_s` of it the tool's own run
    after the call was written (so g = whole_s - tool_s), comes at best after
    max(g, t): the bound is (g + t) / max(g, t). None where the figures do not
    describe such a turn (the tool took longer than the whole)."""
    if whole_s <= 0 or tool_s < 0 or tool_s > whole_s:
        return None
    return whole_s / max(whole_s - tool_s, tool_s)


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

"""Bootstrap intervals, paired ratios and run orders of the benchmark."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.stats import (
    Interval,
    bootstrap,
    mean,
    p90,
    paired_ratio,
    round_orders,
    verdict,
)


def test_interval_of_constant_values_is_the_value() -> None:
    interval = bootstrap([[4.0] * 10, [4.0] * 7], mean)
    assert interval == Interval(4.0, 4.0, 4.0)


def test_mean_interval_matches_the_normal_approximation_on_known_data() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(100.0, 10.0, size=400)
    interval = bootstrap([values.tolist()], mean, seed=3)
    assert interval is not None
    assert interval.estimate == pytest.approx(float(values.mean()))
    standard_error = float(values.std(ddof=1)) / math.sqrt(len(values))
    # 95% normal interval half-width is 1.96 standard errors.
    assert (interval.high - interval.low) / 2 == pytest.approx(1.96 * standard_error, rel=0.1)
    assert interval.low < 100.0 < interval.high


def test_p90_interval_brackets_the_pooled_percentile() -> None:
    interval = bootstrap([list(range(100)), list(range(50, 150))], p90)
    assert interval is not None
    assert interval.estimate == pytest.approx(
        float(np.percentile(list(range(100)) + list(range(50, 150)), 90))
    )
    assert interval.low <= interval.estimate <= interval.high


def test_rounds_that_disagree_widen_the_interval() -> None:
    steady = bootstrap([[10.0, 11.0, 12.0]] * 3, mean)
    drifting = bootstrap([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [30.0, 31.0, 32.0]], mean)
    assert steady is not None and drifting is not None
    assert drifting.high - drifting.low > 5 * (steady.high - steady.low)


def test_same_seed_same_interval() -> None:
    data = [[1.0, 5.0, 2.0, 8.0], [3.0, 3.5, 9.0]]
    assert bootstrap(data, mean, seed=7) == bootstrap(data, mean, seed=7)


def test_no_values_no_interval() -> None:
    assert bootstrap([[], []], mean) is None
    assert paired_ratio([{}], [{}]) is None


def test_paired_ratio_sees_through_round_drift() -> None:
    # The machine is three times slower in round 2, and programs differ tenfold;
    # the system is exactly twice as fast as the reference on every program.
    programs = {f"p{i}": 10.0 * (i + 1) for i in range(8)}
    reference = [programs, {p: 3 * v for p, v in programs.items()}]
    system = [{p: v / 2 for p, v in round_.items()} for round_ in reference]
    paired = paired_ratio(reference, system)
    assert paired is not None
    assert paired.ratio == Interval(2.0, 2.0, 2.0)
    assert paired.per_round == [2.0, 2.0]
    assert paired.programs == 16
    assert paired.verdict == "faster"


def test_unpaired_intervals_would_overlap_where_the_paired_ratio_does_not() -> None:
    rng = np.random.default_rng(0)
    base = rng.lognormal(4.0, 0.6, size=12)
    reference = [
        {f"p{i}": float(v * drift * rng.uniform(0.97, 1.03)) for i, v in enumerate(base)}
        for drift in (1.0, 1.8, 1.3)
    ]
    system = [
        {p: v / 1.1 * float(rng.uniform(0.97, 1.03)) for p, v in round_.items()}
        for round_ in reference
    ]
    paired = paired_ratio(reference, system, seed=1)
    assert paired is not None and paired.ratio.low > 1.0
    reference_mean = bootstrap([list(r.values()) for r in reference], mean, seed=1)
    system_mean = bootstrap([list(r.values()) for r in system], mean, seed=1)
    assert reference_mean is not None and system_mean is not None
    assert system_mean.high > reference_mean.low  # unpaired: overlapping, unresolved


def test_paired_ratio_only_counts_programs_both_completed() -> None:
    reference = [{"a": 10.0, "b": 10.0, "c": 1000.0}]
    system = [{"a": 5.0, "b": 5.0}]
    paired = paired_ratio(reference, system)
    assert paired is not None
    assert paired.ratio.estimate == 2.0 and paired.programs == 2


def test_paired_ratio_of_identical_systems_includes_one() -> None:
    rng = np.random.default_rng(5)
    reference = [
        {f"p{i}": float(v) for i, v in enumerate(rng.lognormal(4, 0.5, 20))} for _ in range(3)
    ]
    system = [
        {p: v * float(rng.normal(1.0, 0.1)) for p, v in round_.items()} for round_ in reference
    ]
    paired = paired_ratio(reference, system)
    assert paired is not None
    assert paired.verdict == "not resolved"


def test_verdict_reads_the_interval_against_one() -> None:
    assert verdict(Interval(1.2, 1.05, 1.4)) == "faster"
    assert verdict(Interval(0.8, 0.7, 0.95)) == "slower"
    assert verdict(Interval(1.1, 0.97, 1.3)) == "not resolved"
    assert verdict(Interval(1.0, 1.0, 1.0)) == "not resolved"


def test_round_orders_are_reproducible_from_the_seed() -> None:
    arms = ["stock-vllm", "stock-ray-serve-llm", "toolserve", "toolserve-no-pinning"]
    assert round_orders(arms, 5, seed=11) == round_orders(arms, 5, seed=11)
    assert round_orders(arms, 5, seed=11) != round_orders(arms, 5, seed=12)


def test_each_round_runs_every_arm_once_in_varying_order() -> None:
    arms = ["a", "b", "c"]
    orders = round_orders(arms, 12, seed=0)
    assert all(sorted(order) == arms for order in orders)
    assert len({order[0] for order in orders}) > 1

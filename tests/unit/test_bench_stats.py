"""Bootstrap intervals, ratios paired by round with their t intervals, and run
orders of the benchmark."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.stats import (
    Interval,
    bootstrap,
    mean,
    overlap_speedup_bound,
    p90,
    paired_ratio,
    pooled_round_ratio,
    round_orders,
    round_ratio_interval,
    t_quantile_975,
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
    assert paired.ratio is not None
    assert (paired.ratio.estimate, paired.ratio.low, paired.ratio.high) == pytest.approx(
        (2.0, 2.0, 2.0)
    )
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
    paired = paired_ratio(reference, system)
    assert paired is not None and paired.ratio is not None and paired.ratio.low > 1.0
    reference_mean = bootstrap([list(r.values()) for r in reference], mean, seed=1)
    system_mean = bootstrap([list(r.values()) for r in system], mean, seed=1)
    assert reference_mean is not None and system_mean is not None
    assert system_mean.high > reference_mean.low  # unpaired: overlapping, unresolved


def test_paired_ratio_only_counts_programs_both_completed() -> None:
    reference = [{"a": 10.0, "b": 10.0, "c": 1000.0}, {"a": 12.0, "b": 8.0}]
    system = [{"a": 5.0, "b": 5.0}, {"a": 5.0, "b": 5.0, "c": 1.0}]
    paired = paired_ratio(reference, system)
    assert paired is not None
    assert paired.per_round == [2.0, 2.0] and paired.programs == 4


def test_one_round_gives_a_ratio_but_no_interval_and_resolves_nothing() -> None:
    paired = paired_ratio([{"a": 10.0, "b": 30.0}], [{"a": 5.0, "b": 15.0}])
    assert paired is not None
    assert paired.ratio is None and paired.verdict == "not resolved"
    assert paired.as_json() == {
        "estimate": 2.0,
        "low": None,
        "high": None,
        "per_round": [2.0],
        "programs": 2,
        "verdict": "not resolved",
    }


def test_round_interval_is_student_t_on_the_logarithms() -> None:
    per_round = [1.10, 1.25, 1.18, 1.30]
    logs = np.log(per_round)
    half_width = 3.182 * logs.std(ddof=1) / math.sqrt(4)
    interval = round_ratio_interval(per_round)
    assert interval is not None
    assert interval.estimate == pytest.approx(math.exp(logs.mean()))
    assert interval.low == pytest.approx(math.exp(logs.mean() - half_width))
    assert interval.high == pytest.approx(math.exp(logs.mean() + half_width))
    assert round_ratio_interval([1.2]) is None


def test_a_pooled_ratio_takes_every_round_of_every_run() -> None:
    first, second = [2.02, 1.92], [1.70, 1.80]
    pooled = pooled_round_ratio(
        [first, second], [round_ratio_interval(first), round_ratio_interval(second)]
    )
    assert pooled is not None
    assert pooled.ratio == round_ratio_interval(first + second)
    assert pooled.rounds == 4
    assert pooled.verdict == "faster"


def test_pooled_runs_disagree_when_no_value_lies_inside_both_intervals() -> None:
    narrow_low, narrow_high = [1.49, 1.50, 1.51], [1.97, 1.98, 1.99]
    intervals = [round_ratio_interval(narrow_low), round_ratio_interval(narrow_high)]
    pooled = pooled_round_ratio([narrow_low, narrow_high], intervals)
    assert pooled is not None and not pooled.runs_agree
    wide = [1.2, 2.1]
    overlapping = pooled_round_ratio([narrow_low, wide], [intervals[0], round_ratio_interval(wide)])
    assert overlapping is not None and overlapping.runs_agree


def test_single_round_runs_pool_once_there_are_two_rounds() -> None:
    assert pooled_round_ratio([[1.4]], [None]) is None
    pooled = pooled_round_ratio([[1.4], [1.6]], [None, None])
    assert pooled is not None and pooled.runs_agree
    assert pooled.ratio.estimate == pytest.approx(math.sqrt(1.4 * 1.6))


def test_an_a_a_run_whose_rounds_all_lean_one_way_is_not_resolved() -> None:
    # Recorded: two arms of stock vLLM, per-round ratios 0.97, 0.98, 0.99; a
    # program-level bootstrap called that 0.98x [0.96, 0.99], "slower".
    interval = round_ratio_interval([0.97, 0.98, 0.99])
    assert interval is not None and verdict(interval) == "not resolved"


def _t_cdf(x: float, degrees_of_freedom: int) -> float:
    """Student's t CDF at x >= 0 by integrating its (symmetric) density from 0."""
    grid = np.linspace(0.0, x, 200_001)
    nu = degrees_of_freedom
    log_norm = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    density = np.exp(log_norm - (nu + 1) / 2 * np.log1p(grid**2 / nu))
    return 0.5 + float(np.trapezoid(density, grid))


@pytest.mark.parametrize("degrees_of_freedom", [1, 2, 3, 5, 10, 30])
def test_t_quantiles_are_the_975th_percentile(degrees_of_freedom: int) -> None:
    quantile = t_quantile_975(degrees_of_freedom)
    assert _t_cdf(quantile, degrees_of_freedom) == pytest.approx(0.975, abs=1e-4)


def test_t_quantiles_past_the_table_stay_conservative() -> None:
    assert t_quantile_975(200) >= 1.96
    with pytest.raises(ValueError):
        t_quantile_975(0)


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


def test_the_overlap_bound_is_whole_over_the_longer_of_decoding_and_tool() -> None:
    # g = 3, t = 1: at best the tool hides inside decoding, 4 / 3.
    assert overlap_speedup_bound(4.0, 1.0) == pytest.approx(4 / 3)
    # g = t: the largest possible gain, twice as soon.
    assert overlap_speedup_bound(4.0, 2.0) == pytest.approx(2.0)
    # g = 1, t = 3: decoding hides inside the tool.
    assert overlap_speedup_bound(4.0, 3.0) == pytest.approx(4 / 3)
    assert overlap_speedup_bound(4.0, 0.0) == pytest.approx(1.0)
    assert overlap_speedup_bound(4.0, 5.0) is None
    assert overlap_speedup_bound(0.0, 0.0) is None

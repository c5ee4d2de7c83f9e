import pytest

from bench.stats import mean_interval, round_ratio_interval
from bench.workloads import plan_workload
from bench.workloads.hot_path import (
    HotPathConfig,
    compare,
    cpu_figures,
    figure_names,
    latency_figures,
    phases,
    throughput_figure,
)


def test_a_mean_of_round_differences_gets_a_student_t_interval() -> None:
    interval = mean_interval([4.0, 2.0])
    assert interval is not None
    # mean 3, sd 1.414, t(1) = 12.706: 3 ± 12.706 * 1.414 / sqrt(2) = 3 ± 12.706
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((3.0, -9.706, 15.706))
    assert mean_interval([4.0]) is None


def test_a_ratio_interval_is_the_mean_interval_of_logarithms() -> None:
    interval = round_ratio_interval([2.0, 0.5])
    assert interval is not None
    assert interval.estimate == pytest.approx(1.0)
    assert interval.low == pytest.approx(1 / interval.high)


def test_phase_figures_in_milliseconds() -> None:
    latencies = [0.010 * step for step in range(1, 101)]  # 10 ms .. 1000 ms
    figures = latency_figures("c8", latencies)
    assert figures["c8_p50_ms"] == pytest.approx(505.0)
    assert figures["c8_p99_ms"] == pytest.approx(990.1)
    assert latency_figures("c8", []) == {}
    assert throughput_figure("c8", 50, 2.0) == {"c8_requests_per_s": 25.0}
    assert throughput_figure("c8", 0, 2.0) == {}
    assert cpu_figures(100, total_cpu_s=3.0, engine_cpu_s=1.0) == {
        "serving_cpu_ms_per_request": pytest.approx(20.0),
        "engine_cpu_ms_per_request": pytest.approx(10.0),
    }


def test_comparison_adds_latencies_and_divides_the_rest() -> None:
    seq, rps, cpu = "sequential_p50_ms", "c8_requests_per_s", "engine_cpu_ms_per_request"
    reference = [{seq: 60.0, rps: 20.0, cpu: 5.0}, {seq: 70.0, rps: 10.0, cpu: 5.0}]
    system = [{seq: 66.0, rps: 18.0, cpu: 4.0}, {seq: 74.0}]
    names = ["sequential_p50_ms", "c8_requests_per_s", "engine_cpu_ms_per_request", "ttft_p50_ms"]
    comparison = compare(reference, system, names)
    assert comparison["sequential_p50_ms"]["kind"] == "added_ms"
    assert comparison["sequential_p50_ms"]["per_round"] == [6.0, 4.0]
    # One round only: no interval.
    assert comparison["c8_requests_per_s"] == {
        "kind": "ratio", "estimate": 0.9, "low": None, "high": None, "per_round": [0.9]
    }  # fmt: skip
    assert comparison["engine_cpu_ms_per_request"]["per_round"] == [0.8]
    assert "ttft_p50_ms" not in comparison


def test_every_phase_has_its_figures_and_the_default_size_has_three_concurrencies() -> None:
    plan = plan_workload("hot-path", "default")
    assert plan.hot_path is not None and plan.build(0) == []
    assert phases(plan.hot_path) == ["sequential", "c8", "c32", "c128", "streamed"]
    config = HotPathConfig(
        sequential_requests=1, concurrency=(4,), requests_per_phase=1, streamed_requests=1
    )
    assert figure_names(config) == [
        "sequential_p50_ms", "sequential_p99_ms", "c4_p50_ms", "c4_p99_ms", "c4_requests_per_s",
        "streamed_p50_ms", "streamed_p99_ms", "ttft_p50_ms", "ttft_p99_ms",
        "serving_cpu_ms_per_request", "engine_cpu_ms_per_request",
    ]  # fmt: skip


def test_the_repeated_prompt_workload_runs_its_one_phase() -> None:
    plan = plan_workload("repeated-prompt", "quick")
    assert plan.hot_path is not None and plan.build(0) == []
    assert phases(plan.hot_path) == ["repeated"]
    assert figure_names(plan.hot_path) == [
        "repeated_p50_ms", "repeated_p99_ms",
        "serving_cpu_ms_per_request", "engine_cpu_ms_per_request",
    ]  # fmt: skip


def test_the_burst_workload_sends_forty_requests_in_bursts_of_eight_at_the_quick_size() -> None:
    plan = plan_workload("burst", "quick")
    assert plan.hot_path is not None and plan.build(0) == []
    assert (plan.hot_path.burst_width, plan.hot_path.burst_iterations) == (8, 5)
    assert phases(plan.hot_path) == ["burst"]
    assert figure_names(plan.hot_path) == [
        "burst_p50_ms", "burst_p99_ms",
        "serving_cpu_ms_per_request", "engine_cpu_ms_per_request",
    ]  # fmt: skip


def test_a_bursts_latency_is_compared_as_a_ratio() -> None:
    comparison = compare([{"burst_p99_ms": 3000.0}], [{"burst_p99_ms": 1000.0}], ["burst_p99_ms"])
    assert comparison["burst_p99_ms"]["kind"] == "ratio"
    assert comparison["burst_p99_ms"]["per_round"] == [pytest.approx(1 / 3)]

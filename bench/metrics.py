"""Benchmark figures computed from the recorded requests and programs (pure)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.records import ClientStall, ProgramRecord, RequestRecord

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

BASELINE = "stock-vllm"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (numpy's default), `fraction` in [0, 1]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _rate(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


@dataclass(frozen=True)
class SystemFigures:
    """What one system did over all its repeats."""

    programs: int
    failed_programs: int
    requests: int
    failed_requests: int
    jct_mean_s: float
    jct_p50_s: float
    jct_p90_s: float
    jct_p99_s: float
    turn_latency_median_s: float
    tokens_per_s: float
    prefix_reuse_rate: float | None
    unusable_call_rate: float | None
    time_saved_vs_stock_vllm_pct: float | None
    peak_live_context_tokens: int
    client_stall_s: float
    jct_mean_without_client_stalls_s: float
    ttft_p50_s: float | None = None
    """Time to first token over the streamed requests that recorded it; None
    where none did."""
    ttft_p99_s: float | None = None


def jct_without_client_stalls(program: ProgramRecord, stalls: Iterable[ClientStall]) -> float:
    """The program's JCT less the time, within its lifetime, that the benchmark
    client of its run was stalled (it could neither send, receive nor end a tool)."""
    stalled = sum(
        max(
            0.0,
            min(program.finished_s, stall.at_s + stall.lag_s) - max(program.arrival_s, stall.at_s),
        )
        for stall in stalls
        if (stall.system, stall.repeat) == (program.system, program.repeat)
    )
    return program.jct_s - stalled


def system_figures(
    programs: Sequence[ProgramRecord],
    requests: Sequence[RequestRecord],
    wall_s: float,
    baseline_jct: dict[str, float] | None = None,
    stalls: Sequence[ClientStall] = (),
) -> SystemFigures:
    """`wall_s` is the summed wall time of the system's runs; `baseline_jct` maps
    program id to stock vLLM's mean JCT for time saved; `stalls` are the client's
    own stalls in those runs."""
    completed = [program for program in programs if program.error is None]
    jcts = [program.jct_s for program in completed]
    answered = [request for request in requests if request.error is None]
    with_cache_info = [request for request in answered if request.cached_tokens is not None]
    calls = sum(program.calls for program in programs)
    first_tokens = [r.first_token_s for r in answered if r.first_token_s is not None]
    return SystemFigures(
        programs=len(programs),
        failed_programs=len(programs) - len(completed),
        requests=len(requests),
        failed_requests=len(requests) - len(answered),
        jct_mean_s=_mean(jcts),
        jct_p50_s=percentile(jcts, 0.5),
        jct_p90_s=percentile(jcts, 0.9),
        jct_p99_s=percentile(jcts, 0.99),
        turn_latency_median_s=percentile([request.latency_s for request in answered], 0.5),
        tokens_per_s=sum(request.completion_tokens for request in answered) / wall_s
        if wall_s > 0
        else math.nan,
        prefix_reuse_rate=_rate(
            sum(request.cached_tokens or 0 for request in with_cache_info),
            sum(request.prompt_tokens for request in with_cache_info),
        )
        if with_cache_info
        else None,
        unusable_call_rate=_rate(sum(program.unusable_calls for program in programs), calls),
        time_saved_vs_stock_vllm_pct=time_saved_pct(mean_jct_by_program(programs), baseline_jct)
        if baseline_jct
        else None,
        peak_live_context_tokens=peak_live_context_tokens(programs, requests),
        client_stall_s=sum(stall.lag_s for stall in stalls),
        jct_mean_without_client_stalls_s=_mean(
            [jct_without_client_stalls(program, stalls) for program in completed]
        ),
        ttft_p50_s=percentile(first_tokens, 0.5) if first_tokens else None,
        ttft_p99_s=percentile(first_tokens, 0.99) if first_tokens else None,
    )


def peak_live_context_tokens(
    programs: Sequence[ProgramRecord], requests: Sequence[RequestRecord]
) -> int:
    """The most context the running programs held at once (any repeat): at each
    request's send time, the sum over unfinished programs of their latest prompt
    plus completion. Above the KV capacity, the engine cannot keep every agent's
    context and must evict some while their tools run."""
    finished_at = {(p.repeat, p.program_id): p.finished_s for p in programs}
    peak = 0
    for repeat in {request.repeat for request in requests}:
        live: dict[str, int] = {}
        for request in sorted(
            (r for r in requests if r.repeat == repeat and r.error is None),
            key=lambda r: r.sent_s,
        ):
            live[request.program_id] = request.prompt_tokens + request.completion_tokens
            live = {
                program_id: tokens
                for program_id, tokens in live.items()
                if finished_at.get((repeat, program_id), math.inf) > request.sent_s
            }
            peak = max(peak, sum(live.values()))
    return peak


def mean_jct_by_program(programs: Iterable[ProgramRecord]) -> dict[str, float]:
    """Mean JCT of each program over repeats (failed runs left out)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for program in programs:
        if program.error is None:
            samples[program.program_id].append(program.jct_s)
    return {program_id: statistics.fmean(values) for program_id, values in samples.items()}


def time_saved_pct(system_jct: dict[str, float], baseline_jct: dict[str, float]) -> float | None:
    """Percent of stock vLLM's total job time saved, on the programs both completed."""
    shared = system_jct.keys() & baseline_jct.keys()
    baseline_total = sum(baseline_jct[program_id] for program_id in shared)
    if not baseline_total:
        return None
    return 100.0 * (1 - sum(system_jct[program_id] for program_id in shared) / baseline_total)


def ratio(baseline: float, value: float) -> float | None:
    """Baseline figure divided by the system's: above 1 means the system is faster."""
    if not value or math.isnan(value) or math.isnan(baseline):
        return None
    return baseline / value


def latency_by_turn_index(requests: Iterable[RequestRecord]) -> dict[int, float]:
    """Median latency of the n-th request of a program, for every n seen."""
    by_index: dict[int, list[float]] = defaultdict(list)
    for request in requests:
        if request.error is None:
            by_index[request.turn_index].append(request.latency_s)
    return {index: percentile(values, 0.5) for index, values in sorted(by_index.items())}


def mean_tool_latency_by_program(programs: Iterable[ProgramRecord]) -> dict[str, float]:
    """Mean seconds per tool round of each program (identical across systems)."""
    per_program: dict[str, list[float]] = defaultdict(list)
    for program in programs:
        if program.calls:
            per_program[program.program_id].append(program.tool_time_s / max(1, program.turns - 1))
    return {program_id: statistics.fmean(values) for program_id, values in per_program.items()}


def time_saved_by_tool_latency(
    system_jct: dict[str, float],
    baseline_jct: dict[str, float],
    tool_latency: dict[str, float],
    buckets: int = 4,
) -> list[tuple[float, float, float]]:
    """Programs grouped by their mean tool latency into quantile buckets:
    (bucket low, bucket high, percent time saved in the bucket)."""
    shared = sorted(
        (tool_latency[program_id], program_id)
        for program_id in system_jct.keys() & baseline_jct.keys() & tool_latency.keys()
    )
    if not shared:
        return []
    size = math.ceil(len(shared) / min(buckets, len(shared)))
    rows = []
    for start in range(0, len(shared), size):
        group = shared[start : start + size]
        ids = [program_id for _, program_id in group]
        saved = time_saved_pct({i: system_jct[i] for i in ids}, {i: baseline_jct[i] for i in ids})
        if saved is not None:
            rows.append((group[0][0], group[-1][0], saved))
    return rows


# Rates a system reports in its Prometheus metrics: name -> (hits, lookups) counter
# name fragments. A mechanism's issue adds its rate here once the system exports it.
REPORTED_RATES: dict[str, tuple[str, str]] = {
    "engine_prefix_hit_rate": ("prefix_cache_hits", "prefix_cache_queries"),
    "pinned_kv_reuse_rate": ("kv_pin_hits", "kv_returning_turns"),
    "tool_cache_hit_rate": ("tool_cache_hits", "tool_cache_lookups"),
    "speculation_acceptance_rate": ("speculations_used", "speculations_issued"),
}
RATE_NAMES = (
    "engine_prefix_hit_rate",
    "pinned_kv_reuse_rate",
    "tool_cache_hit_rate",
    "speculation_acceptance_rate",
    "response_cache_hit_rate",
)


def _parsed_samples(metrics_text: str) -> list[Sample]:
    """Every sample of a scrape (Prometheus text format); none for a scrape that
    does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [
            sample
            for family in text_string_to_metric_families(metrics_text)
            for sample in family.samples
        ]
    except ValueError:
        return []


def counter_totals(metrics_text: str) -> dict[str, float]:
    """Counter values summed over labels, by sample name (Prometheus text format)."""
    totals: dict[str, float] = defaultdict(float)
    for sample in _parsed_samples(metrics_text):
        if sample.name.endswith("_total"):
            totals[sample.name] += sample.value
    return dict(totals)


def gauge_totals(metrics_text: str) -> dict[str, float]:
    """Gauge values summed over labels, by name without the `ray_` Ray exports
    them under (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = defaultdict(float)
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.type == "gauge":
                for sample in family.samples:
                    totals[sample.name.removeprefix("ray_")] += sample.value
    except ValueError:
        return {}
    return dict(totals)


def kv_cache_size_tokens(metrics_text: str) -> int | None:
    """The KV capacity a vLLM engine reports in its cache configuration gauge (the
    largest, when several engines report: the draft model's is the smaller)."""
    from prometheus_client.parser import text_string_to_metric_families

    sizes = []
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name.endswith("cache_config_info"):
                sizes += [
                    int(sample.labels["kv_cache_size_tokens"])
                    for sample in family.samples
                    if sample.labels.get("kv_cache_size_tokens", "").isdigit()
                ]
    except ValueError:
        return None
    return max(sizes, default=None)


def returning_turns(requests: Iterable[RequestRecord]) -> int:
    """Turns after a program's first, as the engines see them: every request after
    the program's first, and every round the server ran after hosted calls within a
    request (a turn to the engine the client never sent)."""
    return sum((request.turn_index > 0) + request.server_ran_rounds for request in requests)


def reported_rates(
    metrics_text: str, returning_turns: int | None = None
) -> dict[str, float | None]:
    """Every rate in RATE_NAMES: the system's figure, or None when it reports none.

    `returning_turns`, the client's count (`returning_turns()`), replaces the
    engines' own count in the pinned-KV reuse rate: with several replicas a turn
    sent to a replica its program never ran on is a miss no engine counts.
    """
    totals = counter_totals(metrics_text)

    def summed(fragment: str) -> float:
        # vLLM's `external_prefix_cache_*` count a KV connector's hits, not the engine's.
        return sum(
            value for name, value in totals.items() if fragment in name and "external" not in name
        )

    rates: dict[str, float | None] = dict.fromkeys(RATE_NAMES)
    for rate, (hits, lookups) in REPORTED_RATES.items():
        rates[rate] = _rate(summed(hits), summed(lookups))
    pin_hits, engine_returning = REPORTED_RATES["pinned_kv_reuse_rate"]
    if returning_turns and summed(engine_returning):
        rates["pinned_kv_reuse_rate"] = summed(pin_hits) / returning_turns
    return rates


# Work the engines did, from vLLM's own counters (exact, the same names on every
# system; Ray prefixes them `ray_vllm_`): figure -> (counter, `source` label).
ENGINE_COUNTERS: dict[str, tuple[str, str | None]] = {
    "prompt_tokens": ("prompt_tokens", None),
    "prompt_tokens_computed": ("prompt_tokens_by_source", "local_compute"),
    "prompt_tokens_from_cache": ("prompt_tokens_by_source", "local_cache_hit"),
    "generation_tokens": ("generation_tokens", None),
    "preemptions": ("num_preemptions", None),
    # Speculative decoding (n-gram drafts): tokens proposed and accepted.
    "draft_tokens": ("spec_decode_num_draft_tokens", None),
    "accepted_draft_tokens": ("spec_decode_num_accepted_tokens", None),
}


@dataclass(frozen=True)
class _CounterSelector:
    """Samples of one counter, by any of its exported names, with a label's value."""

    names: tuple[str, ...]
    label: str | None = None
    value: str | None = None

    def matches(self, name: str, labels: dict[str, str]) -> bool:
        return name in self.names and (self.label is None or labels.get(self.label) == self.value)


def _summed_counters(metrics_text: str, selectors: dict[str, _CounterSelector]) -> dict[str, float]:
    """Each selected figure summed over the samples it selects; a figure nothing
    selects is absent."""
    figures: dict[str, float] = {}
    for sample in _parsed_samples(metrics_text):
        for figure, selector in selectors.items():
            if selector.matches(sample.name, sample.labels):
                figures[figure] = figures.get(figure, 0.0) + sample.value
    return figures


def _summed_by_label(metrics_text: str, names: tuple[str, ...], label: str) -> dict[str, float]:
    """Samples of any of `names`, summed per value of `label`."""
    sums: dict[str, float] = {}
    for sample in _parsed_samples(metrics_text):
        if sample.name in names and label in sample.labels:
            value = sample.labels[label]
            sums[value] = sums.get(value, 0.0) + sample.value
    return sums


_TOOL_LATENCY = "toolserve_tool_latency_s"


def hosted_tool_runs(before_text: str, after_text: str) -> dict[str, dict[str, float]]:
    """Per hosted tool, its runs on the tool workers between two scrapes and their
    summed duration (`toolserve_tool_latency_s`); empty where nothing ran."""

    def totals(text: str, suffix: str) -> dict[str, float]:
        names = (f"{_TOOL_LATENCY}_{suffix}", f"ray_{_TOOL_LATENCY}_{suffix}")
        return _summed_by_label(text, names, "tool")

    runs_before, runs_after = totals(before_text, "count"), totals(after_text, "count")
    seconds_before, seconds_after = totals(before_text, "sum"), totals(after_text, "sum")
    return {
        tool: {
            "runs": runs - runs_before.get(tool, 0.0),
            "seconds": seconds_after.get(tool, 0.0) - seconds_before.get(tool, 0.0),
        }
        for tool, runs in runs_after.items()
        if runs > runs_before.get(tool, 0.0)
    }


def engine_counters(metrics_text: str) -> dict[str, float]:
    """Each ENGINE_COUNTERS figure summed over engines and replicas; a figure no
    engine reported is absent."""
    return _summed_counters(
        metrics_text,
        {
            figure: _CounterSelector(
                (f"vllm:{counter}_total", f"ray_vllm_{counter}_total"),
                "source" if source is not None else None,
                source,
            )
            for figure, (counter, source) in ENGINE_COUNTERS.items()
        },
    )


def engine_work(before_text: str, after_text: str) -> dict[str, float | None]:
    """What the engines did between two scrapes of a system's metrics. Ray exports
    a counter only once it has counted something: where the engines report at all,
    a counter missing from the scrape is zero."""
    before, after = engine_counters(before_text), engine_counters(after_text)
    if not after:
        return dict.fromkeys(ENGINE_COUNTERS)
    return {figure: after.get(figure, 0.0) - before.get(figure, 0.0) for figure in ENGINE_COUNTERS}


# toolserve's chat front end (its own counters; other systems report none):
# figure -> (counter, label, label value).
FRONT_END_COUNTERS: dict[str, tuple[str, str, str]] = {
    "render_cpu_s": ("toolserve_prompt_cpu_seconds", "stage", "render"),
    "tokenize_cpu_s": ("toolserve_prompt_cpu_seconds", "stage", "tokenize"),
    "prompts_rendered": ("toolserve_prompts_prepared", "stage", "render"),
    "prompts_tokenized": ("toolserve_prompts_prepared", "stage", "tokenize"),
    "tokens_from_tokenize_cache": ("toolserve_tokenize_cache_tokens", "source", "cached"),
    "tokens_tokenized": ("toolserve_tokenize_cache_tokens", "source", "tokenized"),
}
FRONT_END_FIGURES = (
    "render_cpu_ms_per_prompt",
    "tokenize_cpu_ms_per_prompt",
    "tokenize_cache_token_share",
)


# toolserve's KV retention (other systems pin nothing): figure -> label value.
RETENTION_FIGURES = {"pinned_token_s_used": "used", "pinned_token_s_wasted": "wasted"}


def retention_work(before_text: str, after_text: str) -> dict[str, float | None]:
    """Context tokens times seconds pins held between two scrapes: used (the
    program came back to its pin) and wasted (released otherwise); None where the
    system reports no pins."""
    counter = "toolserve_kv_pinned_token_seconds"
    selectors = {
        figure: _CounterSelector((f"{counter}_total", f"ray_{counter}_total"), "outcome", outcome)
        for figure, outcome in RETENTION_FIGURES.items()
    }
    before = _summed_counters(before_text, selectors)
    after = _summed_counters(after_text, selectors)
    if not after:
        return dict.fromkeys(RETENTION_FIGURES)
    return {
        figure: after.get(figure, 0.0) - before.get(figure, 0.0) for figure in RETENTION_FIGURES
    }


def _front_end_counters(metrics_text: str) -> dict[str, float]:
    return _summed_counters(
        metrics_text,
        {
            figure: _CounterSelector((f"{counter}_total", f"ray_{counter}_total"), label, value)
            for figure, (counter, label, value) in FRONT_END_COUNTERS.items()
        },
    )


def front_end_work(before_text: str, after_text: str) -> dict[str, float | None]:
    """CPU per prompt of each stage of toolserve's chat front end between two
    scrapes, and the share of prompt tokens whose ids the tokenize cache held;
    None where the system reports no such counters."""
    before, after = _front_end_counters(before_text), _front_end_counters(after_text)
    done = {
        figure: after.get(figure, 0.0) - before.get(figure, 0.0) for figure in FRONT_END_COUNTERS
    }
    per_prompt_ms = {
        stage: 1000 * done[f"{stage}_cpu_s"] / prompts if (prompts := done[count]) else None
        for stage, count in (("render", "prompts_rendered"), ("tokenize", "prompts_tokenized"))
    }
    return {
        "render_cpu_ms_per_prompt": per_prompt_ms["render"],
        "tokenize_cpu_ms_per_prompt": per_prompt_ms["tokenize"],
        "tokenize_cache_token_share": _rate(
            done["tokens_from_tokenize_cache"],
            done["tokens_from_tokenize_cache"] + done["tokens_tokenized"],
        ),
    }

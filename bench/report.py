"""Writes a benchmark run's summary.json, report.md and plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.driver import STALL_THRESHOLD_S, ProgramRecord, RequestRecord
from bench.metrics import (
    BASELINE,
    latency_by_turn_index,
    mean_jct_by_program,
    mean_tool_latency_by_program,
    time_saved_by_tool_latency,
)

PLOTS = {
    "jct_cdf": "jct_cdf.png",
    "turn_latency": "turn_latency_by_turn_index.png",
    "time_saved": "time_saved_by_tool_latency.png",
}


def _clean(value: Any) -> Any:
    """JSON has no NaN: missing figures are null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    return value


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(_clean(summary), indent=2) + "\n")
    return path


def _format(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def write_plots(
    run_dir: Path,
    systems: Sequence[str],
    programs: Sequence[ProgramRecord],
    requests: Sequence[RequestRecord],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    by_system = {name: [p for p in programs if p.system == name] for name in systems}

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in systems:
        jcts = sorted(p.jct_s for p in by_system[name] if p.error is None)
        if jcts:
            fractions = [(index + 1) / len(jcts) for index in range(len(jcts))]
            axes.step(jcts, fractions, where="post", label=name)
    axes.set(xlabel="job completion time (s)", ylabel="fraction of programs", title="JCT CDF")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(run_dir / PLOTS["jct_cdf"], dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in systems:
        by_index = latency_by_turn_index(r for r in requests if r.system == name)
        if by_index:
            axes.plot(list(by_index), list(by_index.values()), marker="o", markersize=3, label=name)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set(
        xlabel="turn index within the program",
        ylabel="median request latency (s)",
        title="Per-turn latency by turn index",
    )
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(run_dir / PLOTS["turn_latency"], dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(7, 4.5))
    baseline_jct = mean_jct_by_program(by_system.get(BASELINE, []))
    tool_latency = mean_tool_latency_by_program(programs)
    others = [name for name in systems if name != BASELINE]
    width = 0.8 / max(1, len(others))
    labels: list[str] = []
    for offset, name in enumerate(others):
        rows = time_saved_by_tool_latency(
            mean_jct_by_program(by_system[name]), baseline_jct, tool_latency
        )
        labels = labels or [f"{low:.1f}-{high:.1f}s" for low, high, _ in rows]
        axes.bar(
            [index + offset * width for index in range(len(rows))],
            [saved for _, _, saved in rows],
            width=width,
            label=name,
        )
    axes.set_xticks([index + width * (len(others) - 1) / 2 for index in range(len(labels))])
    axes.set_xticklabels(labels)
    axes.axhline(0, color="black", linewidth=0.8)
    axes.set(
        xlabel="program's mean tool latency (quantile buckets)",
        ylabel=f"% of {BASELINE}'s job time saved",
        title="Time saved against stock vLLM, by tool latency",
    )
    axes.grid(alpha=0.3, axis="y")
    if others:
        axes.legend()
    figure.tight_layout()
    figure.savefig(run_dir / PLOTS["time_saved"], dpi=110)
    plt.close(figure)


def _memory_pressure(summary: dict[str, Any]) -> list[str]:
    capacity = summary["settings"].get("kv_cache_tokens")
    peaks = {
        name: figures["peak_live_context_tokens"]
        for name, figures in summary["systems"].items()
        if figures.get("peak_live_context_tokens")
    }
    if not capacity or not peaks:
        return []
    highest = max(peaks.values())
    consequence = (
        "so not every agent's KV could stay resident while its tools ran"
        if highest > capacity
        else "within the capacity: this run had no memory pressure"
    )
    return [
        f"Memory pressure: the KV cache holds {capacity} tokens; at the busiest moment the "
        f"running programs' contexts summed to {highest} tokens "
        f"({highest / capacity:.1f}x the capacity), {consequence}.",
        "",
    ]


def _time_saved_by_agent_type(summary: dict[str, Any]) -> list[str]:
    table = summary.get("time_saved_by_agent_type_pct")
    if not table or not table["systems"]:
        return []
    kinds = sorted({kind for row in table["systems"].values() for kind in row})
    lines = [
        f"## Time saved against {table['reference']}, by agent kind",
        "",
        "| system | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for name, row in table["systems"].items():
        cells = " | ".join(_format(row.get(kind), "%", 1) for kind in kinds)
        lines.append(f"| {name} | {cells} |")
    return [
        *lines,
        "",
        "Percent of the reference system's total job time saved over the programs of "
        "each kind both completed (negative: slower).",
        "",
    ]


def _client_stalls(summary: dict[str, Any]) -> list[str]:
    measured = {
        name: figures
        for name, figures in summary["systems"].items()
        if figures.get("client_stall_s") is not None
    }
    if not measured:
        return []
    lines = [
        "## Benchmark client stalls",
        "",
        "Time the benchmark client itself was stalled (its event loop or thread pool "
        f"late by more than {STALL_THRESHOLD_S} s; records of kind `client_stall`), "
        "summed over the system's runs, and the mean JCT less the stalled time within "
        "each program's lifetime. Stalls come from the machine, not the system under test; they "
        "inflate every latency the client measures, tool time included.",
        "",
        "| system | client stalled | JCT mean | JCT mean less client stalls |",
        "|---|---|---|---|",
    ]
    for name, figures in measured.items():
        lines.append(
            f"| {name} | {_format(figures['client_stall_s'], ' s')} "
            f"| {_format(figures['jct_mean_s'], ' s')} "
            f"| {_format(figures['jct_mean_without_client_stalls_s'], ' s')} |"
        )
    return [*lines, ""]


def write_markdown(run_dir: Path, summary: dict[str, Any]) -> Path:
    settings = summary["settings"]
    lines = [
        f"# Benchmark: {summary['workload']} ({summary['size']})",
        "",
        f"Command: `{summary['command']}`",
        "",
        f"Workload: {summary['workload_description']}. Seed {summary['seed']}, "
        f"{summary['repeats']} repeat(s) per system, systems run one after another "
        f"({' '.join(summary['order'])}).",
        "",
        f"Engine for every system: `{settings['model']}` ({settings['dtype']}, eager="
        f"{settings['enforce_eager']}), KV cache {settings['kv_cache_mib']} MiB "
        f"({_format(settings.get('kv_cache_tokens'), ' tokens')}), max_model_len "
        f"{settings['max_model_len']}, block size {settings['block_size']}, prefix caching on, "
        f"OpenMP threads bound to CPUs {settings['cpu_threads_bind']}. Machine: "
        f"{summary['machine']}.",
        "",
        "## Job completion time and latency",
        "",
        "| system | programs (failed) | JCT mean | p50 | p90 | p99 | turn latency median "
        "| tokens/s | JCT mean ratio vs stock vLLM | time saved vs stock vLLM |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = summary["ratios_vs_stock_vllm"]
    for name, figures in summary["systems"].items():
        if "error" in figures:
            lines.append(f"| {name} | failed: {figures['error']} | | | | | | | | |")
            continue
        ratio = ratios.get(name, {}).get("jct_mean")
        lines.append(
            f"| {name} | {figures['programs']} ({figures['failed_programs']}) "
            f"| {_format(figures['jct_mean_s'], ' s')} | {_format(figures['jct_p50_s'], ' s')} "
            f"| {_format(figures['jct_p90_s'], ' s')} | {_format(figures['jct_p99_s'], ' s')} "
            f"| {_format(figures['turn_latency_median_s'], ' s')} "
            f"| {_format(figures['tokens_per_s'], '', 1)} | {_format(ratio, 'x')} "
            f"| {_format(figures['time_saved_vs_stock_vllm_pct'], '%', 1)} |"
        )
    lines += [
        "",
        "Ratios are stock vLLM's figure divided by the system's (above 1: faster). "
        "Time saved compares total job time over the programs both systems completed.",
        "",
        *_client_stalls(summary),
        *_memory_pressure(summary),
        "## Hit rates",
        "",
        "| system | prompt tokens served from cache | engine prefix-cache hit rate "
        "| pinned-KV reuse | tool cache | speculation acceptance | response cache "
        "| unusable tool calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, figures in summary["systems"].items():
        if "error" in figures:
            continue
        lines.append(
            f"| {name} | {_percent(figures['prefix_reuse_rate'])} "
            f"| {_percent(figures['engine_prefix_hit_rate'])} "
            f"| {_percent(figures['pinned_kv_reuse_rate'])} "
            f"| {_percent(figures['tool_cache_hit_rate'])} "
            f"| {_percent(figures['speculation_acceptance_rate'])} "
            f"| {_percent(figures['response_cache_hit_rate'])} "
            f"| {_percent(figures['unusable_call_rate'])} |"
        )
    lines += [
        "",
        "n/a: the system does not report it. The first column is computed from the "
        "responses' `usage.prompt_tokens_details.cached_tokens`; the others are scraped "
        "from the system's Prometheus metrics after its run. Unusable tool calls: calls "
        "that were malformed, named an unknown tool, had arguments the tool rejected, "
        "or did not come where one was required.",
        "",
        *_time_saved_by_agent_type(summary),
        "## Plots",
        "",
        f"![JCT CDF]({PLOTS['jct_cdf']})",
        "",
        f"![Per-turn latency by turn index]({PLOTS['turn_latency']})",
        "",
        f"![Time saved by tool latency]({PLOTS['time_saved']})",
        "",
        "## Files",
        "",
        "- `summary.json`: the figures above",
        "- `records.jsonl`: one line per request and per program, every system and repeat",
        "- `console.log`: what the command printed",
        "- `logs/`: each system's server log, configuration and final metrics scrape",
        "",
    ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path

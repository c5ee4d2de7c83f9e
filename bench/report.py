"""Writes a benchmark run's summary.json, report.md and plots."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.driver import STALL_THRESHOLD_S
from bench.markdown import markdown_table
from bench.metrics import (
    BASELINE,
    latency_by_turn_index,
    mean_jct_by_program,
    mean_tool_latency_by_program,
    time_saved_by_tool_latency,
)
from bench.prefix_hold import HELD_TARGET
from bench.records import RECORDS_FILE, ProgramRecord, RequestRecord
from bench.workloads.hot_path import ADDED

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

    def save(figure: Any, axes: Any, plot: str, legend: bool) -> None:
        if legend:
            axes.legend()
        figure.tight_layout()
        figure.savefig(run_dir / PLOTS[plot], dpi=110)
        plt.close(figure)

    by_system = {name: [p for p in programs if p.system == name] for name in systems}

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in systems:
        jcts = sorted(p.jct_s for p in by_system[name] if p.error is None)
        if jcts:
            fractions = [(index + 1) / len(jcts) for index in range(len(jcts))]
            axes.step(jcts, fractions, where="post", label=name)
    axes.set(xlabel="job completion time (s)", ylabel="fraction of programs", title="JCT CDF")
    axes.grid(alpha=0.3)
    save(figure, axes, "jct_cdf", legend=True)

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
    save(figure, axes, "turn_latency", legend=True)

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
    save(figure, axes, "time_saved", legend=bool(others))


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
    return [
        f"## Time saved against {table['reference']}, by agent kind",
        "",
        *markdown_table(
            ["system", *kinds],
            [
                [name, *(_format(row.get(kind), "%", 1) for kind in kinds)]
                for name, row in table["systems"].items()
            ],
        ),
        "",
        "Percent of the reference system's total job time saved over the programs of "
        "each kind both completed (negative: slower).",
        "",
    ]


def jct_ratio_by_agent_type_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    """The report's section on each kind's paired mean JCT ratio (also printed by
    `toolserve bench-table --by-kind` from a recorded run's records)."""
    if not comparisons:
        return []
    rows = [
        [entry["system"], entry["reference"], kind, *_ratio_cells(ratio)]
        for entry in comparisons
        for kind, ratio in entry["by_kind"].items()
    ]
    return [
        "## Mean JCT ratio by agent kind (paired by round)",
        "",
        "As in the comparisons above, over each kind's programs alone.",
        "",
        *markdown_table(
            [
                "system",
                "reference",
                "agent kind",
                "mean JCT ratio [95% CI]",
                "per round",
                "verdict",
            ],
            rows,
        ),
        "",
    ]


def _first_tool_result(summary: dict[str, Any]) -> list[str]:
    table = summary.get("first_tool_result")
    if not table:
        return []
    kinds = sorted({kind for rows in table["systems"].values() for kind in rows})
    return [
        "## Time to the first tool result, by agent kind",
        "",
        "Streamed turns whose calls the server ran: mean seconds from sending the turn to "
        "the first chunk that carried a tool result the server ran (for a call the server "
        "rejected, its error), over rounds and turns; in brackets, the mean run of the "
        "kind's tool on the tool workers (`toolserve_tool_latency_s`; a partial run "
        "counts from its start, while the call was still written).",
        "",
        *markdown_table(
            ["system", *kinds],
            [
                [name, *(_time_to_first_result(rows.get(kind) or {}) for kind in kinds)]
                for name, rows in table["systems"].items()
            ],
        ),
        "",
        "The reference's time over the system's (above 1: the result came sooner), "
        "paired by round as the JCT ratios are. Bound: Conveyor's (arXiv 2406.00059, "
        "§3.4) for one call, (g + t) / max(g, t), with t the reference's mean tool run "
        "and g the rest of its time to the result (prefill and queueing included, so "
        "the bound is generous where they are large).",
        "",
        *markdown_table(
            [
                "system",
                "reference",
                "agent kind",
                "ratio [95% CI]",
                "per round",
                "verdict",
                "bound",
            ],
            [
                [
                    entry["system"],
                    entry["reference"],
                    kind,
                    *_ratio_cells(entry["by_kind"].get(kind)),
                    _format((entry["by_kind"].get(kind) or {}).get("bound"), "x"),
                ]
                for entry in table["comparisons"]
                for kind in kinds
            ],
        ),
        "",
    ]


def _time_to_first_result(row: dict[str, Any]) -> str:
    """`1.20 s (0.80 s python)`: the mean time to the first result, and the mean
    run of the kind's tool where it was measured."""
    tool = row.get("tool_s_per_run")
    return _format(row.get("mean_s"), " s") + (
        f" ({_format(tool, ' s')} {row['tool']})" if tool is not None else ""
    )


def _prefix_hold(summary: dict[str, Any]) -> list[str]:
    rows = []
    for name, figures in summary["systems"].items():
        hold = figures.get("prefix_hold")
        if not hold:
            continue
        for kind, row in [("all", hold["all"]), *hold["by_agent_type"].items()]:
            checks = ", ".join(
                f"{outcome} {count}" for outcome, count in row["prefix_checks"].items()
            )
            rows.append(
                [
                    name,
                    kind,
                    str(row["returning_requests"]),
                    f"{_percent(row['held_share_mean'])} (min {_percent(row['held_share_min'])})",
                    _percent(row["at_target_share"]),
                    _percent(row["held_share_of_blocks_mean"]),
                    _format(row["recomputed_tokens_mean"], digits=0),
                    checks or "n/a",
                ]
            )
    if not rows:
        return []
    return [
        "## Prefix held per returning request",
        "",
        *markdown_table(
            [
                "system",
                "agent kind",
                "returning requests",
                "previous prompt+reply from cache",
                f"requests at {HELD_TARGET:.0%}",
                "of its full blocks",
                "prompt tokens computed per request",
                "server's prefix checks",
            ],
            rows,
        ),
        "",
        "Per request after a program's first: the cached prompt tokens the server "
        "reported (`usage.prompt_tokens_details.cached_tokens`, read off the wire under "
        "each client library) over the previous request's prompt and reply (the context "
        "the engine held; a block cache keeps only its full blocks, next column). "
        "Where the server ran tools within the previous request its usage sums several "
        "rounds: such requests count in the token column, not in the shares. Server's "
        "prefix checks: `X-Toolserve-Prefix` outcomes by cause.",
        "",
    ]


RETENTION_COLUMNS = ["pinned token-s used", "wasted", "wasted share", "pinned-KV reuse"]


def retention_rows(summary: dict[str, Any]) -> list[list[str]]:
    """Each system's pinned token-seconds used and wasted a round, the wasted
    share and the pinned-KV reuse (systems that pin nothing: no row)."""
    rows = []
    for name, figures in summary["systems"].items():
        work = figures.get("work") or {}
        used = (work.get("pinned_token_s_used") or {}).get("mean")
        wasted = (work.get("pinned_token_s_wasted") or {}).get("mean")
        if used is None or wasted is None:
            continue
        held = used + wasted
        rows.append(
            [
                name,
                f"{used:,.0f}",
                f"{wasted:,.0f}",
                f"{wasted / held:.0%}" if held else "n/a",
                _percent(figures.get("pinned_kv_reuse_rate")),
            ]
        )
    return rows


def _retention(summary: dict[str, Any]) -> list[str]:
    rows = retention_rows(summary)
    if not rows:
        return []
    return [
        "## KV retention (mean per round)",
        "",
        "Context tokens times seconds the engines kept programs' KV pinned "
        "(`toolserve_kv_pinned_token_seconds`): used when the program came back to its "
        "pin, wasted when the pin went otherwise (expired, displaced, moved, or the "
        "program ended first).",
        "",
        *markdown_table(["system", *RETENTION_COLUMNS], rows),
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
    return [
        "## Benchmark client stalls",
        "",
        "Time the benchmark client itself was stalled (its event loop or thread pool "
        f"late by more than {STALL_THRESHOLD_S} s; records of kind `client_stall`), "
        "summed over the system's runs, and the mean JCT less the stalled time within "
        "each program's lifetime. Stalls come from the machine, not the system under test; they "
        "inflate every latency the client measures, tool time included.",
        "",
        *markdown_table(
            ["system", "client stalled", "JCT mean", "JCT mean less client stalls"],
            [
                [
                    name,
                    _format(figures["client_stall_s"], " s"),
                    _format(figures["jct_mean_s"], " s"),
                    _format(figures["jct_mean_without_client_stalls_s"], " s"),
                ]
                for name, figures in measured.items()
            ],
        ),
        "",
    ]


def format_interval(
    value: Mapping[str, float | None] | None, unit: str = "", digits: int = 1
) -> str:
    """`1.23x [1.10, 1.37]`; `n/a` without a figure, `(one round)` without an interval."""
    if not value or value["estimate"] is None:
        return "n/a"
    estimate = f"{value['estimate']:.{digits}f}{unit}"
    if value["low"] is None or value["high"] is None:
        return f"{estimate} (one round)"
    return f"{estimate} [{value['low']:.{digits}f}, {value['high']:.{digits}f}]"


def _provenance(summary: dict[str, Any]) -> list[str]:
    provenance = summary.get("provenance") or {}
    if not provenance:
        return []
    machine = provenance["machine"]
    packages = ", ".join(
        f"{name} {version}" for name, version in provenance["packages"].items() if version
    )
    warnings = []
    if provenance["dirty"]:
        warnings.append(
            "**Recorded from a dirty tree** (`--allow-dirty`): "
            + ", ".join(f"`{path}`" for path in provenance["dirty_paths"])
        )
    if provenance["code_changed_during_run"]:
        warnings.append("**The code changed while the run was going:** rounds ran different code.")
    return [
        *[f"{warning}\n" for warning in warnings],
        f"Code: commit `{provenance['commit']}`"
        + (" (dirty)" if provenance["dirty"] else " (clean tree)")
        + f"; {packages}. Run {provenance['started_utc']} to {provenance['finished_utc']}. "
        f"Machine: {machine['cores']} cores ({machine['usable_cores']} usable), "
        f"{machine['memory_gib']} GiB, {machine['cpu_model']}, {machine['architecture']}, "
        f"Linux {machine['kernel']}, Python {machine['python']}.",
        "",
    ]


def _per_round(ratio: dict[str, Any] | None) -> str:
    """A comparison's ratio in each round: `1.20 / 1.05 / 1.16`."""
    return " / ".join(f"{value:.2f}" for value in ratio["per_round"]) if ratio else ""


def _ratio_cells(ratio: dict[str, Any] | None) -> list[str]:
    """A paired ratio's cells: with its interval, each round's, its verdict."""
    return [
        format_interval(ratio, "x", 2),
        _per_round(ratio),
        ratio["verdict"] if ratio else "n/a",
    ]


def _comparisons(summary: dict[str, Any]) -> list[str]:
    comparisons = summary.get("comparisons") or []
    if not comparisons:
        return []
    return [
        "## Comparisons (paired by round)",
        "",
        "Ratio of mean JCT, the reference's over the system's (above 1: the system is "
        "faster), on the programs both completed: each round gives one ratio, and the "
        "figure is their geometric mean with a 95% Student-t interval over the rounds "
        "(the round is the unit that repeats; one round gives no interval). The verdict is "
        "`not resolved` when the interval includes 1.0. "
        "The last column repeats it with each program's JCT less the time the benchmark "
        "client was stalled (secondary: see the A/A run for whether it narrows the noise).",
        "",
        *markdown_table(
            [
                "system",
                "reference",
                "mean JCT ratio [95% CI]",
                "per round",
                "verdict",
                "less client stalls [95% CI]",
            ],
            [
                [
                    entry["system"],
                    entry["reference"],
                    *_ratio_cells(entry["jct_mean"]),
                    format_interval(entry["jct_mean_less_client_stalls"], "x", 2),
                ]
                for entry in comparisons
            ],
        ),
        "",
    ]


def _peer_report(summary: dict[str, Any]) -> list[str]:
    """AIPerf's own summary of each run beside ours, where AIPerf drove the load."""
    systems = {
        name: figures["aiperf"]
        for name, figures in summary["systems"].items()
        if figures.get("aiperf")
    }
    if not systems:
        return []
    lines = [
        "## AIPerf's own report",
        "",
        "From `profile_export_aiperf.json`, which AIPerf wrote for each run (under "
        "`aiperf/<system>-r<round>/`), averaged over the rounds: its request latency "
        "(the whole turn, streamed), time to first token, inter-token latency and output "
        "throughput. Its request-latency ratio is compared round by round like the JCT "
        "ratio above.",
        "",
        *markdown_table(
            [
                "system",
                "request latency mean",
                "request latency p90",
                "time to first token",
                "inter-token latency",
                "output tokens/s",
            ],
            [
                [
                    name,
                    _format(figures["request_latency_ms"]["mean"], " ms", 0),
                    _format(figures["request_latency_p90_ms"]["mean"], " ms", 0),
                    _format(figures["time_to_first_token_ms"]["mean"], " ms", 0),
                    _format(figures["inter_token_latency_ms"]["mean"], " ms", 1),
                    _format(figures["output_tokens_per_s"]["mean"], "", 1),
                ]
                for name, figures in systems.items()
            ],
        ),
    ]
    ratios = [entry for entry in summary["comparisons"] if entry.get("aiperf_request_latency_mean")]
    if ratios:
        lines += [
            "",
            *markdown_table(
                [
                    "system",
                    "reference",
                    "AIPerf request latency ratio [95% CI]",
                    "per round",
                    "verdict",
                    "our mean JCT ratio",
                ],
                [
                    [
                        entry["system"],
                        entry["reference"],
                        *_ratio_cells(entry["aiperf_request_latency_mean"]),
                        format_interval(entry["jct_mean"], "x", 2),
                    ]
                    for entry in ratios
                ],
            ),
        ]
    return [*lines, ""]


def _hot_path(summary: dict[str, Any]) -> list[str]:
    systems = {
        name: figures["hot_path"]
        for name, figures in summary["systems"].items()
        if figures.get("hot_path")
    }
    if not systems:
        return []
    names = list(next(iter(systems.values())))
    lines = [
        "## Hot path",
        "",
        "Each figure's mean over the rounds (latencies in ms at p50 and p99 of each phase: "
        "`sequential` one at a time, `cN` with N in flight, `streamed` one at a time, "
        "`repeated` one question again and again, `burst` requests sent a team at a time; "
        "`ttft` the streamed phase's first token; "
        "requests/s of the concurrent phases; CPU "
        "ms per request of the serving processes and of the engine).",
        "",
        *markdown_table(
            ["figure", *systems],
            [
                [name, *(_format(figures[name]["mean"], "", 1) for figures in systems.values())]
                for name in names
            ],
        ),
    ]
    for entry in summary["comparisons"]:
        comparison = entry.get("hot_path")
        if not comparison:
            continue
        lines += [
            "",
            f"{entry['system']} against {entry['reference']}, round by round: latencies as "
            "milliseconds added (negative: faster), a burst's latencies and other figures "
            "as the system's over the reference's, with 95% Student-t intervals over the "
            "rounds.",
            "",
            *markdown_table(
                ["figure", "added ms or ratio [95% CI]", "per round"],
                [
                    [
                        name,
                        format_interval(value, " ms" if value["kind"] == ADDED else "x", 2),
                        " / ".join(f"{figure:.2f}" for figure in value["per_round"]),
                    ]
                    for name, value in comparison.items()
                ],
            ),
        ]
    return [*lines, ""]


def _work(summary: dict[str, Any]) -> list[str]:
    rows = {
        name: figures["work"] for name, figures in summary["systems"].items() if figures.get("work")
    }
    if not rows:
        return []

    def cell(work: dict[str, Any], name: str, digits: int = 0) -> str:
        mean = work.get(name, {}).get("mean")
        return "n/a" if mean is None else f"{mean:,.{digits}f}"

    def acceptance(work: dict[str, Any]) -> str:
        drafted = work.get("draft_tokens", {}).get("mean")
        accepted = work.get("accepted_draft_tokens", {}).get("mean")
        return f"{accepted / drafted:.0%}" if drafted and accepted is not None else "none"

    lines = [
        "## Work done (mean per round)",
        "",
        "From the engines' own counters (`vllm:prompt_tokens`, "
        "`vllm:prompt_tokens_by_source`, `vllm:generation_tokens`, `vllm:num_preemptions`, "
        "`vllm:spec_decode_num_draft_tokens` and `_accepted_tokens`; "
        "scraped right before and after each run) and the kernel's CPU time of each "
        "system's whole process tree during the run (engine: vLLM's engine core and worker "
        "processes). The same method for every system; less sensitive to a noisy machine "
        "than times. vLLM 0.32 does not export the tokens it recomputes after a "
        "preemption, so they are not here.",
        "",
        *markdown_table(
            [
                "system",
                "prompt tokens",
                "computed",
                "from cache",
                "generated",
                "preemptions",
                "drafted tokens",
                "accepted",
                "draft acceptance",
                "CPU s (all)",
                "CPU s (engine)",
            ],
            [
                [
                    name,
                    cell(work, "prompt_tokens"),
                    cell(work, "prompt_tokens_computed"),
                    cell(work, "prompt_tokens_from_cache"),
                    cell(work, "generation_tokens"),
                    cell(work, "preemptions", 1),
                    cell(work, "draft_tokens"),
                    cell(work, "accepted_draft_tokens"),
                    acceptance(work),
                    cell(work, "cpu_total_s"),
                    cell(work, "cpu_engine_s"),
                ]
                for name, work in rows.items()
            ],
        ),
    ]
    return [*lines, "", *_front_end(rows)]


def _front_end(rows: dict[str, dict[str, Any]]) -> list[str]:
    measured = {
        name: work
        for name, work in rows.items()
        if work.get("tokenize_cpu_ms_per_prompt", {}).get("mean") is not None
    }
    if not measured:
        return []

    def cell(work: dict[str, Any], name: str) -> str:
        figure = work.get(name, {})
        per_round = ", ".join(_format(value, "", 2) for value in figure.get("per_round", []))
        return f"{_format(figure.get('mean'), '', 2)} ({per_round})"

    return [
        "## Prompt preparation (toolserve's chat front end)",
        "",
        "CPU time of the replica's chat front end per prompt, by stage, from toolserve's "
        "`toolserve_prompt_cpu_seconds` and `toolserve_prompts_prepared` (the thread time "
        "of each render and tokenization); the share of prompt tokens whose ids the "
        "tokenize cache held (`toolserve_tokenize_cache_tokens`). Mean over rounds, each "
        "round's in brackets. Other systems do not report it.",
        "",
        *markdown_table(
            [
                "system",
                "render CPU ms per prompt",
                "tokenize CPU ms per prompt",
                "prompt tokens from the tokenize cache",
            ],
            [
                [
                    name,
                    cell(work, "render_cpu_ms_per_prompt"),
                    cell(work, "tokenize_cpu_ms_per_prompt"),
                    _percent(work.get("tokenize_cache_token_share", {}).get("mean")),
                ]
                for name, work in measured.items()
            ],
        ),
        "",
    ]


def _files(summary: dict[str, Any]) -> list[str]:
    """What a committed run keeps, and the raw output that stays beside the run."""
    dashboards = bool(summary.get("dashboards"))
    aiperf = any(figures.get("aiperf") for figures in summary["systems"].values())
    return [
        "## Files",
        "",
        "A committed run keeps what its figures come from:",
        "",
        "- `summary.json`: the figures above",
        "- `report.md`: this report, written from `summary.json`",
        "- `NOTE.md`, where the run has one: what it was recorded for",
        "- " + ", ".join(f"`{name}`" for name in PLOTS.values()) + ": the plots above",
        f"- `{RECORDS_FILE}`: one line per request, per program and per client stall, "
        "every system and round (gzip)",
        *(
            ["- `dashboards/`: each toolserve arm's dashboards, drawn after its run"]
            if dashboards
            else []
        ),
        "",
        "The raw output stays beside the run, uncommitted:",
        "",
        "- `console.log`: what the command printed",
        "- `logs/`: each system's server log and configuration, its metrics scrapes "
        "before and after each run and its CPU time by process",
        *(
            [
                "- `aiperf/`: AIPerf's own files per system and round (its command, console "
                "output, summary report and per-request export)"
            ]
            if aiperf
            else []
        ),
        *(["- `prometheus/`: the local Prometheus's working files"] if dashboards else []),
        "",
    ]


JCT_HEADERS = [
    "system",
    "programs (failed)",
    "JCT mean",
    "median",
    "p90",
    "p99",
    "turn latency median",
    "tokens/s",
    "time saved vs stock vLLM",
]
TTFT_HEADERS = ["TTFT p50", "TTFT p99"]


def has_first_tokens(summary: dict[str, Any]) -> bool:
    """Whether any system timed its turns' first tokens (streamed turns; runs
    recorded before the bench timed them have no such figures)."""
    return any(figures.get("ttft_p50_s") is not None for figures in summary["systems"].values())


def _jct_row(name: str, figures: dict[str, Any], with_ttft: bool = False) -> list[str]:
    """A system's row of the JCT table; a failed system's names its error."""
    if "error" in figures:
        return [name, f"failed: {figures['error']}"]
    intervals = figures["intervals"]
    ttft = [_format(figures.get("ttft_p50_s"), " s"), _format(figures.get("ttft_p99_s"), " s")]
    return [
        name,
        f"{figures['programs']} ({figures['failed_programs']})",
        format_interval(intervals["jct_mean_s"], " s"),
        format_interval(intervals["jct_median_s"], " s"),
        format_interval(intervals["jct_p90_s"], " s"),
        _format(figures["jct_p99_s"], " s"),
        _format(figures["turn_latency_median_s"], " s"),
        _format(figures["tokens_per_s"], "", 1),
        _format(figures["time_saved_vs_stock_vllm_pct"], "%", 1),
        *(ttft if with_ttft else []),
    ]


def write_markdown(run_dir: Path, summary: dict[str, Any]) -> Path:
    settings = summary["settings"]
    with_ttft = has_first_tokens(summary)
    orders = "; ".join(" ".join(order) for order in summary["round_orders"])
    lines = [
        f"# Benchmark: {summary['workload']} ({summary['size']})",
        "",
        "Command:",
        "",
        f"```\n{summary['command']}\n```",
        "",
        *_provenance(summary),
        *(
            [
                f"**Partial:** {summary['rounds']} of {summary['rounds_planned']} rounds "
                "recorded so far (the run was still going or was cut short).",
                "",
            ]
            if summary.get("rounds_planned", summary["rounds"]) > summary["rounds"]
            else []
        ),
        f"Workload: {summary['workload_description']}. Seed {summary['seed']}, "
        f"{summary['rounds']} round(s), each system once per round in a random order "
        f"(seed {summary['order_seed']}): {orders}."
        + (" A/A run: one system as two arms." if summary.get("aa") else "")
        + (
            " With `--dashboards`: a local Prometheus scraped each toolserve arm every "
            "5 s and the dashboards were drawn after its run (`dashboards/`), work the "
            "other systems did not get."
            if summary.get("dashboards")
            else ""
        ),
        "",
        f"Engine for every system: `{settings['model']}` ({settings['dtype']}, eager="
        f"{settings['enforce_eager']}), KV cache {settings['kv_cache_mib']} MiB "
        f"({_format(settings.get('kv_cache_tokens'), ' tokens')}), max_model_len "
        f"{settings['max_model_len']}, block size {settings['block_size']}, prefix caching on, "
        f"OpenMP threads bound to CPUs {settings['cpu_threads_bind']}. Process environment "
        "of every system: "
        + ", ".join(f"`{k}={v}`" for k, v in settings["process_environment"].items())
        + "."
        + (
            f" Each system's session at niceness {settings['session_nice']} against the "
            "benchmark client's."
            if "session_nice" in settings
            else ""
        ),
        "",
        *(
            [
                "Arms with settings of their own (`NAME@PATH=VALUE`, applied over the above; "
                "each arm's environment and command are in `summary.json`): "
                + ", ".join(f"`{label}`" for label in summary["arms"] if "@" in label)
                + ".",
                "",
            ]
            if any("@" in label for label in summary.get("arms", {}))
            else []
        ),
        "## Job completion time and latency",
        "",
        "Each with its 95% bootstrap interval over rounds and programs.",
        "",
        *markdown_table(
            JCT_HEADERS + (TTFT_HEADERS if with_ttft else []),
            [_jct_row(name, figures, with_ttft) for name, figures in summary["systems"].items()],
        ),
        "",
        "Time saved compares total job time over the programs both systems completed."
        + (
            " TTFT: seconds from sending a streamed turn to its first generated token, "
            "over every round's turns."
            if with_ttft
            else ""
        ),
        "",
        *_comparisons(summary),
        *_peer_report(summary),
        *_hot_path(summary),
        *_work(summary),
        *_retention(summary),
        *_client_stalls(summary),
        *_memory_pressure(summary),
        "## Hit rates",
        "",
        *markdown_table(
            [
                "system",
                "prompt tokens served from cache",
                "engine prefix-cache hit rate",
                "pinned-KV reuse",
                "tool cache",
                "speculation acceptance",
                "response cache",
                "unusable tool calls",
            ],
            [
                [
                    name,
                    *(
                        _percent(figures[rate])
                        for rate in (
                            "prefix_reuse_rate",
                            "engine_prefix_hit_rate",
                            "pinned_kv_reuse_rate",
                            "tool_cache_hit_rate",
                            "speculation_acceptance_rate",
                            "response_cache_hit_rate",
                            "unusable_call_rate",
                        )
                    ),
                ]
                for name, figures in summary["systems"].items()
                if "error" not in figures
            ],
        ),
        "",
        "n/a: the system does not report it. The first column is computed from the "
        "responses' `usage.prompt_tokens_details.cached_tokens`; the others are scraped "
        "from the system's Prometheus metrics after its run. Unusable tool calls: calls "
        "that were malformed, named an unknown tool, had arguments the tool rejected, "
        "or did not come where one was required.",
        "",
        *_prefix_hold(summary),
        *_time_saved_by_agent_type(summary),
        *jct_ratio_by_agent_type_lines(summary.get("jct_ratio_by_agent_type", [])),
        *_first_tool_result(summary),
        "## Plots",
        "",
        f"![JCT CDF]({PLOTS['jct_cdf']})",
        "",
        f"![Per-turn latency by turn index]({PLOTS['turn_latency']})",
        "",
        f"![Time saved by tool latency]({PLOTS['time_saved']})",
        "",
        *_files(summary),
    ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path

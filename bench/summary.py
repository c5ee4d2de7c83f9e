"""A run's statistics and its summary (`summary.json`): per system its figures
with bootstrap intervals, work and peer figures by round; the compared pairs'
paired ratios, overall and per agent kind."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.cpu import CpuUse
from bench.metrics import (
    BASELINE,
    ENGINE_COUNTERS,
    FRONT_END_FIGURES,
    RATE_NAMES,
    RETENTION_FIGURES,
    jct_without_client_stalls,
    mean_jct_by_program,
    system_figures,
    time_saved_pct,
)
from bench.options import BenchOptions, parse_system
from bench.peer import AIPERF_FIGURES
from bench.prefix_hold import prefix_hold
from bench.provenance import Provenance
from bench.records import ClientStall, ProgramRecord, RequestRecord
from bench.stats import STATISTICS, bootstrap, overlap_speedup_bound, paired_ratio
from bench.systems import EngineSettings, ladder_systems
from bench.workloads import hot_path, plan_workload


@dataclass
class ArmRun:
    """What one arm produced in one round."""

    round: int
    programs: list[ProgramRecord]
    requests: list[RequestRecord]
    stalls: list[ClientStall]
    wall_s: float
    startup_s: float
    rates: dict[str, float | None]
    work: dict[str, float | None]
    cpu: CpuUse
    kv_cache_tokens: int | None
    run_figures: dict[str, float] = field(default_factory=dict)
    """The run's figures of its own: AIPerf's report where AIPerf drove the load,
    the phases' figures of the hot path."""
    tool_runs: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per hosted tool: its runs on the tool workers and their summed seconds."""


@dataclass
class ArmRuns:
    system: str
    runs: list[ArmRun] = field(default_factory=list)
    launch: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def programs(self) -> list[ProgramRecord]:
        return [program for run in self.runs for program in run.programs]

    @property
    def requests(self) -> list[RequestRecord]:
        return [request for run in self.runs for request in run.requests]

    @property
    def stalls(self) -> list[ClientStall]:
        return [stall for run in self.runs for stall in run.stalls]


def _mean(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def _jct_by_round(arm: ArmRuns, rounds: int, less_stalls: bool = False) -> list[dict[str, float]]:
    """Per round, program id -> JCT of the programs the arm completed."""
    by_round: list[dict[str, float]] = [{} for _ in range(rounds)]
    for run in arm.runs:
        for program in run.programs:
            if program.error is None:
                by_round[run.round][program.program_id] = (
                    jct_without_client_stalls(program, run.stalls) if less_stalls else program.jct_s
                )
    return by_round


def _intervals(arm: ArmRuns, rounds: int, seed: int) -> dict[str, Any]:
    jct = [list(values.values()) for values in _jct_by_round(arm, rounds)]
    less_stalls = [list(values.values()) for values in _jct_by_round(arm, rounds, True)]
    intervals = {
        f"jct_{name}_s": bootstrap(jct, statistic, seed) for name, statistic in STATISTICS.items()
    }
    intervals["jct_mean_less_client_stalls_s"] = bootstrap(less_stalls, STATISTICS["mean"], seed)
    return {name: value.as_json() if value else None for name, value in intervals.items()}


def _by_round(
    arm: ArmRuns, names: Sequence[str], figures: Callable[[ArmRun], dict[str, Any]]
) -> dict[str, Any]:
    """Each named figure of every round's run: their mean and each round's."""
    runs = sorted(arm.runs, key=lambda run: run.round)
    by_round: dict[str, Any] = {}
    for name in names:
        values = [figures(run).get(name) for run in runs]
        by_round[name] = {"mean": _mean(values), "per_round": values}
    return by_round


def _work(arm: ArmRuns) -> dict[str, Any]:
    """Engine counters, CPU seconds and the chat front end's CPU per prompt."""
    return _by_round(
        arm,
        [
            *ENGINE_COUNTERS,
            "cpu_total_s",
            "cpu_engine_s",
            *FRONT_END_FIGURES,
            *RETENTION_FIGURES,
        ],
        lambda run: run.work | run.cpu.as_json(),
    )


def _run_figures_by_round(arm: ArmRuns, rounds: int) -> list[dict[str, float]]:
    by_round: list[dict[str, float]] = [{} for _ in range(rounds)]
    for run in arm.runs:
        by_round[run.round] = run.run_figures
    return by_round


def _peer_figure_by_round(arm: ArmRuns, rounds: int, name: str) -> list[dict[str, float]]:
    """A peer report's figure per round, shaped as one program per round for
    `paired_ratio`: the ratio of two arms is then taken round by round."""
    return [
        {"run": figures[name]} if name in figures else {}
        for figures in _run_figures_by_round(arm, rounds)
    ]


def comparison_pairs(labels: Sequence[str]) -> list[tuple[str, str]]:
    """(reference, system) pairs: every arm against the first (stock vLLM in the
    default set); toolserve against every other stock arm (the strongest stock
    setup is not always the first) and each of its variants (what the mechanism
    it lacks is worth); each rung of the mechanism ladder against the rung below
    it; an arm with settings of its own against the first arm of the same system."""
    if not labels:
        return []
    reference, *others = labels
    pairs = [(reference, label) for label in others]
    if "toolserve" in labels:
        pairs += [
            (label, "toolserve")
            for label in labels
            if label.startswith(("toolserve-", "stock-")) and label != reference
        ]
    ladder = [name for name in ("stock-vllm", *ladder_systems(), "toolserve") if name in labels]
    pairs += list(itertools.pairwise(ladder)) if len(ladder) > 2 else []
    first_of_system: dict[str, str] = {}
    for label in labels:
        first = first_of_system.setdefault(parse_system(label)[0], label)
        if first != label and "@" in label + first:
            pairs.append((first, label))
    return list(dict.fromkeys(pairs))


def summarize(
    options: BenchOptions,
    description: str,
    settings: EngineSettings,
    kv_cache_mib: int,
    orders: list[list[str]],
    runs: dict[str, ArmRuns],
    provenance: Provenance,
    order_seed: int,
    reference_system: str | None = None,
) -> dict[str, Any]:
    rounds = len(orders)
    plan = plan_workload(options.workload, options.size, options.programs)
    hot_path_config = plan.hot_path
    hot_path_figures = hot_path.figure_names(hot_path_config) if hot_path_config else []
    baseline = runs.get(BASELINE)
    baseline_jct = mean_jct_by_program(baseline.programs) if baseline else None
    systems: dict[str, Any] = {}
    for label, arm in runs.items():
        if not arm.runs:
            systems[label] = {"error": "; ".join(arm.errors) or "no programs ran"}
            continue
        figures = system_figures(
            arm.programs,
            arm.requests,
            sum(run.wall_s for run in arm.runs),
            baseline_jct if label != BASELINE else None,
            arm.stalls,
        )
        systems[label] = {
            "system": arm.system,
            "rounds_completed": len(arm.runs),
            "errors": arm.errors,
            **figures.__dict__,
            **{rate: _mean([run.rates.get(rate) for run in arm.runs]) for rate in RATE_NAMES},
            "startup_s": [run.startup_s for run in arm.runs],
            "intervals": _intervals(arm, rounds, options.seed),
            "work": _work(arm),
            **(
                {"aiperf": _by_round(arm, list(AIPERF_FIGURES), lambda run: run.run_figures)}
                if not hot_path_config and any(run.run_figures for run in arm.runs)
                else {}
            ),
            **(
                {"hot_path": _by_round(arm, hot_path_figures, lambda run: run.run_figures)}
                if hot_path_config
                else {}
            ),
            **(
                {"prefix_hold": prefix_hold(arm.requests, settings.block_size)}
                if plan.client_agents
                else {}
            ),
        }
    comparisons = []
    for reference, label in comparison_pairs(list(runs)):
        if not (runs[reference].runs and runs[label].runs):
            continue
        entry: dict[str, Any] = {"reference": reference, "system": label}
        for figure, less_stalls in (("jct_mean", False), ("jct_mean_less_client_stalls", True)):
            paired = paired_ratio(
                _jct_by_round(runs[reference], rounds, less_stalls),
                _jct_by_round(runs[label], rounds, less_stalls),
            )
            entry[figure] = paired.as_json() if paired else None
        # The peer's own figure, compared the same way (round by round).
        peer = paired_ratio(
            _peer_figure_by_round(runs[reference], rounds, "request_latency_ms"),
            _peer_figure_by_round(runs[label], rounds, "request_latency_ms"),
        )
        if peer:
            entry["aiperf_request_latency_mean"] = peer.as_json()
        if hot_path_config:
            entry["hot_path"] = hot_path.compare(
                _run_figures_by_round(runs[reference], rounds),
                _run_figures_by_round(runs[label], rounds),
                hot_path_figures,
            )
        comparisons.append(entry)
    capacity = next(
        (run.kv_cache_tokens for arm in runs.values() for run in arm.runs if run.kv_cache_tokens),
        None,
    )
    return {
        "provenance": provenance.as_json(),
        "command": provenance.command,
        "workload": options.workload,
        "workload_description": description,
        "size": options.size,
        **({"programs_per_round": plan.programs} if plan.programs is not None else {}),
        "seed": options.seed,
        "rounds": rounds,
        "order_seed": order_seed,
        "round_orders": orders,
        "aa": options.aa,
        "dashboards": options.dashboards,
        "arms": {label: arm.system for label, arm in runs.items()},
        "settings": {
            "model": settings.model_path.rsplit("/", 1)[-1],
            "dtype": settings.dtype,
            "enforce_eager": settings.enforce_eager,
            "kv_cache_mib": kv_cache_mib,
            "kv_cache_tokens": capacity,
            "max_model_len": settings.max_model_len,
            "block_size": settings.block_size,
            "max_num_seqs": settings.max_num_seqs,
            "cpu_threads_bind": settings.cpu_threads_bind,
            "process_environment": settings.process_environment(),
            "session_nice": settings.session_nice,
        },
        "systems": systems,
        "comparisons": comparisons,
        "effective_configuration": {label: arm.launch for label, arm in runs.items()},
        **_time_saved_by_agent_type(runs, reference_system),
        **_jct_ratio_by_agent_type(runs, rounds),
        **_first_tool_result_by_agent_type(runs, rounds, plan.tool_of_agent_type),
    }


def _time_saved_by_agent_type(
    runs: dict[str, ArmRuns], reference_system: str | None
) -> dict[str, Any]:
    """Per agent kind, each system's percent of the reference system's job time
    saved (the speculation workload's kinds differ by tool latency)."""
    reference = runs.get(reference_system) if reference_system else None
    if reference is None or not reference.runs:
        return {}
    kinds = sorted({program.agent_type for program in reference.programs})
    table: dict[str, dict[str, float | None]] = {}
    for label, arm in runs.items():
        if label == reference_system or not arm.runs:
            continue
        table[label] = {
            kind: time_saved_pct(
                mean_jct_by_program(p for p in arm.programs if p.agent_type == kind),
                mean_jct_by_program(p for p in reference.programs if p.agent_type == kind),
            )
            for kind in kinds
        }
    return {"time_saved_by_agent_type_pct": {"reference": reference_system, "systems": table}}


def _jct_ratio_by_agent_type(runs: dict[str, ArmRuns], rounds: int) -> dict[str, Any]:
    comparisons = jct_ratio_by_agent_type(
        {label: arm.programs for label, arm in runs.items()}, rounds
    )
    return {"jct_ratio_by_agent_type": comparisons} if comparisons else {}


def jct_ratio_by_agent_type(
    programs: Mapping[str, Sequence[ProgramRecord]], rounds: int
) -> list[dict[str, Any]]:
    """Where programs are of several kinds: each compared pair's mean JCT ratio per
    kind, paired by round (a program's `repeat`) as the whole run's is (a null
    case's "no slowdown" is a claim about its own programs, which the run's mean
    can hide). `programs`: each arm's, in the run's arm order."""
    kinds = sorted({program.agent_type for arm in programs.values() for program in arm})
    if len(kinds) < 2:
        return []

    def by_round(label: str, kind: str) -> list[dict[str, float]]:
        jct: list[dict[str, float]] = [{} for _ in range(rounds)]
        for program in programs[label]:
            if program.error is None and program.agent_type == kind:
                jct[program.repeat][program.program_id] = program.jct_s
        return jct

    comparisons = []
    for reference, label in comparison_pairs(list(programs)):
        by_kind = {}
        for kind in kinds:
            paired = paired_ratio(by_round(reference, kind), by_round(label, kind))
            by_kind[kind] = paired.as_json() if paired else None
        comparisons.append({"reference": reference, "system": label, "by_kind": by_kind})
    return comparisons


def _first_results_by_round(arm: ArmRuns, rounds: int, agent_type: str) -> list[dict[str, float]]:
    """Per round, `program#turn` -> seconds to the turn's first server-run tool result."""
    by_round: list[dict[str, float]] = [{} for _ in range(rounds)]
    for run in arm.runs:
        for request in run.requests:
            if request.agent_type == agent_type and request.first_result_s is not None:
                key = f"{request.program_id}#{request.turn_index}"
                by_round[run.round][key] = request.first_result_s
    return by_round


def _tool_seconds_per_run(arm: ArmRuns, tool: str) -> float | None:
    runs = sum(run.tool_runs.get(tool, {}).get("runs", 0.0) for run in arm.runs)
    seconds = sum(run.tool_runs.get(tool, {}).get("seconds", 0.0) for run in arm.runs)
    return seconds / runs if runs else None


def _first_tool_result_by_agent_type(
    runs: dict[str, ArmRuns], rounds: int, tool_of_agent_type: dict[str, str]
) -> dict[str, Any]:
    """Where the server ran tools inside streamed turns: per agent kind, each
    arm's mean time from sending a turn to its first tool result (for a call the
    server rejected, to its error), the pairwise ratios round by round, and the
    mean run time of the kind's tool on the tool workers."""
    kinds = sorted(
        {
            request.agent_type
            for arm in runs.values()
            for request in arm.requests
            if request.first_result_s is not None
        }
    )
    if not kinds:
        return {}
    by_round = {
        (label, kind): _first_results_by_round(arm, rounds, kind)
        for label, arm in runs.items()
        for kind in kinds
    }
    mean_s: dict[tuple[str, str], float | None] = {}
    tool_s: dict[tuple[str, str], float | None] = {}
    systems: dict[str, dict[str, Any]] = {}
    for label, arm in runs.items():
        systems[label] = {}
        for kind in kinds:
            seconds = [v for r in by_round[label, kind] for v in r.values()]
            tool = tool_of_agent_type.get(kind)
            mean_s[label, kind] = sum(seconds) / len(seconds) if seconds else None
            tool_s[label, kind] = _tool_seconds_per_run(arm, tool) if tool else None
            systems[label][kind] = {
                "mean_s": mean_s[label, kind],
                "turns": len(seconds),
                "tool": tool,
                "tool_s_per_run": tool_s[label, kind],
            }
    comparisons = []
    for reference, label in comparison_pairs(list(runs)):
        by_kind = {}
        for kind in kinds:
            paired = paired_ratio(by_round[reference, kind], by_round[label, kind])
            whole, tool_run = mean_s[reference, kind], tool_s[reference, kind]
            bound = (
                overlap_speedup_bound(whole, tool_run)
                if whole is not None and tool_run is not None
                else None
            )
            by_kind[kind] = (paired.as_json() | {"bound": bound}) if paired else None
        comparisons.append({"reference": reference, "system": label, "by_kind": by_kind})
    return {"first_tool_result": {"systems": systems, "comparisons": comparisons}}

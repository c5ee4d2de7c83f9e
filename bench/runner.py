"""`toolserve bench`: runs one workload on several systems in rounds (every system
once per round, in a seeded random order) and writes the run's records,
summary, report and plots."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.cpu import CpuUse, ProcessTreeCpu
from bench.dashboards import DashboardCapture
from bench.driver import ClientStall, ProgramRecord, RequestRecord, run_workload
from bench.hot_path import run_hot_path
from bench.metrics import (
    BASELINE,
    ENGINE_COUNTERS,
    FRONT_END_FIGURES,
    RATE_NAMES,
    engine_work,
    front_end_work,
    hosted_tool_runs,
    jct_without_client_stalls,
    kv_cache_size_tokens,
    mean_jct_by_program,
    reported_rates,
    system_figures,
    time_saved_pct,
)
from bench.peer import AIPERF_FIGURES, aiperf_report_figures, run_aiperf
from bench.provenance import Provenance, note_code_state, start_provenance, utc_now
from bench.report import write_markdown, write_plots, write_summary
from bench.stats import STATISTICS, bootstrap, overlap_speedup_bound, paired_ratio, round_orders
from bench.systems import (
    EngineSettings,
    LaunchPlan,
    SystemSpec,
    cleared_toolserve_state,
    engine_settings,
    ladder_systems,
    scrape_metrics,
    system_catalog,
    with_overrides,
)
from bench.workloads import Size, WorkloadPlan, hot_path, plan_workload
from cluster.config import REPO_ROOT, ToolserveConfig, load_config

Log = Callable[[str], None]
_READY_TIMEOUT_S = 900.0
# Ray's processes report their metrics every 10 s (as users run it: a shorter
# interval would cost the Ray-based systems CPU by the second), so a scrape sees
# what happened up to one interval earlier.
_METRICS_SETTLE_S = 12.0
AA_ARMS = ("A", "B")


@dataclass(frozen=True)
class BenchOptions:
    workload: str
    size: Size
    systems: Sequence[str]
    seed: int
    repeats: int
    config_path: Path | None
    output_dir: Path
    run_name: str
    argv: Sequence[str]
    model: str | None = None
    kv_cache_mib: int | None = None
    show_progress: bool = True
    config_overrides: dict[str, Any] = field(default_factory=dict)
    aa: bool = False
    """A/A: the one system in `systems` runs as two arms in every round."""
    order_seed: int | None = None
    """Seed of the rounds' run orders (default: `seed`)."""
    allow_dirty: bool = False
    dashboards: bool = False
    """A local Prometheus scrapes the toolserve arms; their dashboards are drawn."""


def parse_system(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME` or `NAME@PATH=VALUE@...`: a system with settings of its own (VALUE
    is YAML), e.g. `stock-vllm@main.cpu_threads_bind=0` to try a thread setting."""
    name, *settings = text.split("@")
    overrides: dict[str, Any] = {}
    for setting in settings:
        path, separator, value = setting.partition("=")
        if not separator or not path:
            raise ValueError(f"{text!r}: expected NAME@PATH=VALUE, got {setting!r}")
        overrides[path] = yaml.safe_load(value)
    return name, overrides


def arms_of(options: BenchOptions) -> dict[str, str]:
    """Arm label -> system (as `parse_system` reads it). An A/A run's arms are
    one system twice."""
    if not options.aa:
        return {text: text for text in options.systems}
    if len(options.systems) != 1:
        raise ValueError("an A/A run takes exactly one system")
    (system,) = options.systems
    return {f"{system}#{arm}": system for arm in AA_ARMS}


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


def _raw_config(options: BenchOptions) -> dict[str, Any]:
    config = load_config(options.config_path)
    raw: dict[str, Any] = json.loads(config.model_dump_json())
    if options.model:
        raw = with_overrides(
            raw,
            {"main.engine.model": options.model}
            | ({"draft.engine.model": options.model} if raw.get("draft") else {}),
        )
    return with_overrides(raw, options.config_overrides)


def run_benchmark(options: BenchOptions, log: Log = print) -> Path:
    plan = plan_workload(options.workload, options.size)
    catalog = system_catalog()
    unknown = [text for text in options.systems if parse_system(text)[0] not in catalog]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {', '.join(catalog)}")
    if options.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if len(set(options.systems)) != len(options.systems):
        raise ValueError("a system is named twice; for an A/A run use --aa")
    arms = arms_of(options)
    provenance = start_provenance(
        ["toolserve", *options.argv], REPO_ROOT, options.output_dir, options.allow_dirty
    )
    raw_config = with_overrides(_raw_config(options), plan.toolserve_overrides)
    config = ToolserveConfig.model_validate(raw_config)
    kv_cache_mib = options.kv_cache_mib or plan.kv_cache_mib
    settings = engine_settings(config, kv_cache_mib * 2**20, plan.max_model_len)
    setups = {
        label: arm_setup(system, raw_config, kv_cache_mib, plan.max_model_len)
        for label, system in arms.items()
    }

    run_dir = options.output_dir / options.run_name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    records_path = run_dir / "records.jsonl"
    records_path.write_text("")
    log = _also_to_file(log, run_dir / "console.log")
    order_seed = options.seed if options.order_seed is None else options.order_seed
    orders = round_orders(list(arms), options.repeats, order_seed)
    log(f"bench: {plan.description}")
    if provenance.dirty:
        log(f"bench: WARNING: recording from a dirty tree: {', '.join(provenance.dirty_paths)}")
    log(
        f"bench: {options.repeats} round(s) of {len(arms)} arms at {provenance.commit}, "
        f"orders {orders} (seed {order_seed}) -> {run_dir}"
    )

    runs = {label: ArmRuns(system) for label, system in arms.items()}
    capture = DashboardCapture(run_dir, log) if options.dashboards else None
    if capture is not None:
        capture.start()

    def record_rounds(done: list[list[str]]) -> dict[str, Any]:
        """The summary of the rounds done so far, written at once, so a run cut
        short keeps every round it finished."""
        summary = summarize(
            options,
            plan.description,
            settings,
            kv_cache_mib,
            done,
            runs,
            provenance,
            order_seed,
            plan.reference_system,
        )
        summary["rounds_planned"] = len(orders)
        write_summary(run_dir, summary)
        write_markdown(run_dir, summary)
        return summary

    try:
        for round_index, order in enumerate(orders):
            for label in order:
                if not note_code_state(provenance, REPO_ROOT, options.output_dir):
                    log(
                        "bench: WARNING: the code changed since the run started; the report says so"
                    )
                arm_run = _run_arm(
                    options, plan, label, round_index, setups[label], run_dir, runs, log, capture
                )
                if arm_run is None:
                    continue
                with records_path.open("a") as records:
                    for line in (
                        [r.as_json() for r in arm_run.requests]
                        + [p.as_json() for p in arm_run.programs]
                        + [s.as_json() for s in arm_run.stalls]
                    ):
                        records.write(json.dumps(line) + "\n")
            if round_index + 1 < len(orders):
                record_rounds(orders[: round_index + 1])
                log(f"bench: round {round_index} recorded ({round_index + 1} of {len(orders)})")
    finally:
        if capture is not None:
            capture.stop()
    note_code_state(provenance, REPO_ROOT, options.output_dir)
    provenance.finished_utc = utc_now()
    record_rounds(orders)
    write_plots(
        run_dir,
        list(runs),
        [program for arm in runs.values() for program in arm.programs],
        [request for arm in runs.values() for request in arm.requests],
    )
    log(f"bench: report at {run_dir / 'report.md'}")
    return run_dir


def _also_to_file(log: Log, path: Path) -> Log:
    """The run's console lines, kept next to its results as the raw output."""
    path.write_text("")

    def log_and_keep(line: str) -> None:
        log(line)
        with path.open("a") as console:
            console.write(line + "\n")

    return log_and_keep


@dataclass(frozen=True)
class ArmSetup:
    """An arm's system, configuration and engine settings (its own where it
    names settings of its own)."""

    spec: SystemSpec
    raw_config: dict[str, Any]
    settings: EngineSettings


def arm_setup(
    system: str, raw_config: dict[str, Any], kv_cache_mib: int, max_model_len: int
) -> ArmSetup:
    name, overrides = parse_system(system)
    spec = system_catalog()[name]
    raw = with_overrides(spec.configured(raw_config), overrides)
    config = ToolserveConfig.model_validate(raw)
    return ArmSetup(spec, raw, engine_settings(config, kv_cache_mib * 2**20, max_model_len))


def _run_arm(
    options: BenchOptions,
    plan: WorkloadPlan,
    label: str,
    round_index: int,
    setup: ArmSetup,
    run_dir: Path,
    runs: dict[str, ArmRuns],
    log: Log,
    capture: DashboardCapture | None = None,
) -> ArmRun | None:
    arm = runs[label]
    spec, raw_config, settings = setup.spec, setup.raw_config, setup.settings
    tag = f"{label}-r{round_index}".replace("/", "_")
    launch: LaunchPlan = spec.plan(settings, raw_config, run_dir, tag)
    arm.launch = arm.launch or launch.as_json()
    endpoint = launch.endpoint
    process = launch.process()
    if launch.toolserve_config is not None:
        cleared = cleared_toolserve_state(launch.toolserve_config["redis"]["url"])
        log(f"bench: cleared {cleared} toolserve keys from Redis before {label}")
    log(f"bench: starting {label} (round {round_index}); log {launch.log_path}")
    started = time.monotonic()
    try:
        process.start()
        process.wait_ready(endpoint.base_url, settings.served_model_name, _READY_TIMEOUT_S)
        startup = time.monotonic() - started
        log(f"bench: {label} ready in {startup:.0f}s; running {options.workload}")
        draft = (raw_config.get("draft") or {}).get("engine", {}).get("served_model_name")
        watching = capture if spec.kind == "toolserve" else None
        if watching is not None:
            watching.watch(endpoint.metrics_url, label)
        captured_from = datetime.now(UTC)
        time.sleep(_METRICS_SETTLE_S)
        metrics_before = scrape_metrics(endpoint.metrics_url)
        cpu = ProcessTreeCpu(process.pid)
        cpu.start()
        run_figures: dict[str, float] = {}
        try:
            if plan.hot_path:
                result, run_figures = asyncio.run(
                    run_hot_path(
                        plan.hot_path,
                        endpoint.base_url,
                        settings.served_model_name,
                        label,
                        round_index,
                    )
                )
            else:
                result = (
                    run_aiperf(
                        plan.peer.model_copy(update={"seed": options.seed}),
                        endpoint.base_url,
                        settings.served_model_name,
                        settings.model_path,
                        run_dir / "aiperf" / tag,
                        label,
                        round_index,
                    )
                    if plan.peer
                    else asyncio.run(
                        run_workload(
                            plan.build(options.seed),
                            endpoint.base_url,
                            settings.served_model_name,
                            label,
                            round_index,
                            options.show_progress,
                            draft_model=draft if spec.client_speculation else None,
                            hosts_tools=spec.kind == "toolserve",
                        )
                    )
                )
        finally:
            cpu_use = cpu.stop()
        time.sleep(_METRICS_SETTLE_S)
        metrics_after = scrape_metrics(endpoint.metrics_url)
        if watching is not None:
            watching.draw(tag, captured_from, datetime.now(UTC))
            watching.watch(None)
    except RuntimeError as error:
        log(f"bench: {label} failed: {error}")
        arm.errors.append(f"round {round_index}: {error}")
        return None
    finally:
        log(f"bench: stopping {label}")
        process.stop()
    (run_dir / "logs" / f"{tag}.metrics.txt").write_text(metrics_after)
    (run_dir / "logs" / f"{tag}.metrics-before.txt").write_text(metrics_before)
    if plan.peer:
        run_figures = aiperf_report_figures(run_dir / "aiperf" / tag)
    elif plan.hot_path:
        run_figures |= hot_path.cpu_figures(len(result.requests), cpu_use.total_s, cpu_use.engine_s)
    returning_turns = sum(request.turn_index > 0 for request in result.requests)
    arm_run = ArmRun(
        round=round_index,
        programs=result.programs,
        requests=result.requests,
        stalls=result.stalls,
        wall_s=result.wall_s,
        startup_s=startup,
        rates=reported_rates(metrics_after, returning_turns),
        work=engine_work(metrics_before, metrics_after)
        | front_end_work(metrics_before, metrics_after),
        cpu=cpu_use,
        kv_cache_tokens=kv_cache_size_tokens(metrics_after),
        run_figures=run_figures,
        tool_runs=hosted_tool_runs(metrics_before, metrics_after),
    )
    arm.runs.append(arm_run)
    (run_dir / "logs" / f"{tag}.cpu.json").write_text(
        json.dumps(cpu_use.by_process_name, indent=2) + "\n"
    )
    failed = sum(program.error is not None for program in result.programs)
    stalled = [stall.lag_s for stall in result.stalls]
    log(
        f"bench: {label} done in {result.wall_s:.0f}s, {len(result.requests)} requests, "
        f"{failed} failed programs; CPU {cpu_use.total_s:.0f}s "
        f"(engine {cpu_use.engine_s:.0f}s); client stalls: {len(stalled)}, "
        f"longest {max(stalled, default=0.0):.1f}s, total {sum(stalled):.1f}s"
    )
    return arm_run


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
        [*ENGINE_COUNTERS, "cpu_total_s", "cpu_engine_s", *FRONT_END_FIGURES],
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
    plan = plan_workload(options.workload, options.size)
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


def default_run_name(workload: str, size: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}-{size}"

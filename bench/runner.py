"""`toolserve bench`: runs one workload on several systems in rounds (every system
once per round, in a seeded random order) and writes the run's records,
summary, report and plots."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.client_agents import run_client_agents
from bench.cpu import ProcessTreeCpu
from bench.dashboards import DashboardCapture
from bench.driver import run_workload
from bench.hot_path import run_hot_path
from bench.metrics import (
    engine_work,
    front_end_work,
    hosted_tool_runs,
    kv_cache_size_tokens,
    reported_rates,
    retention_work,
    returning_turns,
)
from bench.options import BenchOptions, arms_of, parse_system
from bench.peer import aiperf_report_figures, run_aiperf
from bench.provenance import note_code_state, start_provenance, utc_now
from bench.records import append_records, start_records
from bench.report import write_markdown, write_plots, write_summary
from bench.stats import round_orders
from bench.summary import ArmRun, ArmRuns, summarize
from bench.systems import (
    NODES_KINDS,
    EngineSettings,
    LaunchPlan,
    SystemSpec,
    cleared_toolserve_state,
    engine_settings,
    system_catalog,
    with_overrides,
)
from bench.workloads import WorkloadPlan, hot_path, plan_workload
from cluster.config import REPO_ROOT, ToolserveConfig, load_config

Log = Callable[[str], None]
READY_TIMEOUT_S = 900.0


def raw_profile_config(
    config_path: Path | None, model: str | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The profile as plain data, with `model` for every engine and `overrides`."""
    config = load_config(config_path)
    raw: dict[str, Any] = json.loads(config.model_dump_json())
    if model:
        raw = with_overrides(
            raw,
            {"main.engine.model": model}
            | ({"draft.engine.model": model} if raw.get("draft") else {}),
        )
    return with_overrides(raw, overrides or {})


def run_benchmark(options: BenchOptions, log: Log = print) -> Path:
    plan = plan_workload(options.workload, options.size, options.programs)
    catalog = system_catalog()
    unknown = [text for text in options.systems if parse_system(text)[0] not in catalog]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {', '.join(catalog)}")
    if options.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if len(set(options.systems)) != len(options.systems):
        raise ValueError("a system is named twice; for an A/A run use --aa")
    arms = arms_of(options)
    if options.nodes:
        check_nodes_run(options, [parse_system(system)[0] for system in arms.values()])
    provenance = start_provenance(
        ["toolserve", *options.argv], REPO_ROOT, options.output_dir, options.allow_dirty
    )
    raw_config = with_overrides(
        raw_profile_config(options.config_path, options.model, options.config_overrides),
        plan.toolserve_overrides,
    )
    config = ToolserveConfig.model_validate(raw_config)
    if options.nodes and config.ray.address is None:
        raise ValueError(
            "--nodes needs a profile that joins the nodes' cluster (ray.address), "
            "e.g. --config configs/multinode-cpu.yaml"
        )
    kv_cache_mib = options.kv_cache_mib or plan.kv_cache_mib
    settings = engine_settings(config, kv_cache_mib * 2**20, plan.max_model_len)
    setups = {
        label: arm_setup(system, raw_config, kv_cache_mib, plan.max_model_len)
        for label, system in arms.items()
    }

    run_dir = options.output_dir / options.run_name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    records_path = start_records(run_dir)
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
        """The summary, report and plots of the rounds done so far, written at
        once, so a run cut short keeps every round it finished and its report's
        plots exist."""
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
        write_plots(
            run_dir,
            list(runs),
            [program for arm in runs.values() for program in arm.programs],
            [request for arm in runs.values() for request in arm.requests],
        )
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
                append_records(
                    records_path, [*arm_run.requests, *arm_run.programs, *arm_run.stalls]
                )
            if round_index + 1 < len(orders):
                record_rounds(orders[: round_index + 1])
                log(f"bench: round {round_index} recorded ({round_index + 1} of {len(orders)})")
    finally:
        if capture is not None:
            capture.stop()
    note_code_state(provenance, REPO_ROOT, options.output_dir)
    provenance.finished_utc = utc_now()
    record_rounds(orders)
    log(f"bench: report at {run_dir / 'report.md'}")
    return run_dir


def check_nodes_run(options: BenchOptions, systems: list[str]) -> None:
    """A run on the nodes takes the systems that run there, and draws no dashboards
    (its local Prometheus scrapes one address per arm)."""
    catalog = system_catalog()
    elsewhere = [name for name in systems if not catalog[name].runs_on_nodes]
    if elsewhere:
        raise ValueError(
            f"{', '.join(elsewhere)} run on one host only; --nodes takes systems built "
            f"on {', '.join(NODES_KINDS)}"
        )
    if options.dashboards:
        raise ValueError("--dashboards does not run with --nodes")


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
    launch: LaunchPlan = spec.plan(settings, raw_config, run_dir, tag, options.nodes)
    arm.launch = arm.launch or launch.as_json()
    endpoint = launch.endpoint
    process = launch.process()
    # The nodes' Redis starts empty with every `toolserve nodes up`.
    if launch.toolserve_config is not None and not options.nodes:
        cleared = cleared_toolserve_state(launch.toolserve_config["redis"]["url"])
        log(f"bench: cleared {cleared} toolserve keys from Redis before {label}")
    log(f"bench: starting {label} (round {round_index}); log {launch.log_path}")
    started = time.monotonic()
    try:
        process.start()
        process.wait_ready(endpoint.base_url, settings.served_model_name, READY_TIMEOUT_S)
        startup = time.monotonic() - started
        log(f"bench: {label} ready in {startup:.0f}s; running {options.workload}")
        draft = (raw_config.get("draft") or {}).get("engine", {}).get("served_model_name")
        watching = capture if spec.kind == "toolserve" else None
        if watching is not None:
            watching.watch(endpoint.metrics_url, label)
        captured_from = datetime.now(UTC)
        time.sleep(spec.metrics_lag_s)
        metrics_before = endpoint.scrape()
        # On the nodes, Ray's daemons and the servers run in the nodes' namespaces,
        # not under the launcher.
        cpu = ProcessTreeCpu(process.pid, other_network_namespaces=options.nodes)
        cpu.start()
        run_figures: dict[str, float] = {}
        try:
            if plan.client_agents:
                result = asyncio.run(
                    run_client_agents(
                        plan.client_agents,
                        options.seed,
                        endpoint.base_url,
                        settings.served_model_name,
                        label,
                        round_index,
                    )
                )
            elif plan.hot_path:
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
        time.sleep(spec.metrics_lag_s)
        metrics_after = endpoint.scrape()
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
    arm_run = ArmRun(
        round=round_index,
        programs=result.programs,
        requests=result.requests,
        stalls=result.stalls,
        wall_s=result.wall_s,
        startup_s=startup,
        rates=reported_rates(metrics_after, returning_turns(result.requests)),
        work=engine_work(metrics_before, metrics_after)
        | front_end_work(metrics_before, metrics_after)
        | retention_work(metrics_before, metrics_after),
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

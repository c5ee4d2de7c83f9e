"""`toolserve bench`: runs one workload on several systems, one after another,
and writes the run's records, summary, report and plots."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.driver import ClientStall, ProgramRecord, RequestRecord, RunResult, run_workload
from bench.metrics import (
    BASELINE,
    RATE_NAMES,
    kv_cache_size_tokens,
    mean_jct_by_program,
    ratio,
    reported_rates,
    system_figures,
    time_saved_pct,
)
from bench.report import write_markdown, write_plots, write_summary
from bench.systems import (
    EngineSettings,
    engine_settings,
    scrape_metrics,
    system_catalog,
    with_overrides,
)
from bench.workloads import Size, plan_workload
from cluster.config import ToolserveConfig, load_config

Log = Callable[[str], None]
_READY_TIMEOUT_S = 900.0
_METRICS_SETTLE_S = 3.0


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
    command: str
    model: str | None = None
    kv_cache_mib: int | None = None
    show_progress: bool = True
    config_overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class SystemRuns:
    """Everything one system produced across its repeats."""

    programs: list[ProgramRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    startup_s: list[float] = field(default_factory=list)
    rates: list[dict[str, float | None]] = field(default_factory=list)
    stalls: list[ClientStall] = field(default_factory=list)
    kv_cache_tokens: int | None = None
    error: str | None = None


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
    unknown = [name for name in options.systems if name not in catalog]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {', '.join(catalog)}")
    raw_config = with_overrides(_raw_config(options), plan.toolserve_overrides)
    config = ToolserveConfig.model_validate(raw_config)
    kv_cache_mib = options.kv_cache_mib or plan.kv_cache_mib
    settings = engine_settings(config, kv_cache_mib * 2**20, plan.max_model_len)

    run_dir = options.output_dir / options.run_name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    records_path = run_dir / "records.jsonl"
    records_path.write_text("")
    log = _also_to_file(log, run_dir / "console.log")
    order = [name for _ in range(options.repeats) for name in options.systems]
    log(f"bench: {plan.description}")
    log(f"bench: {len(order)} system runs ({', '.join(order)}) -> {run_dir}")

    runs: dict[str, SystemRuns] = {name: SystemRuns() for name in options.systems}
    for position, name in enumerate(order):
        repeat = position // len(options.systems)
        result = _run_system(
            options, plan.build, name, repeat, settings, raw_config, run_dir, runs, log
        )
        if result is None:
            continue
        with records_path.open("a") as records:
            for line in (
                [r.as_json() for r in result.requests]
                + [p.as_json() for p in result.programs]
                + [s.as_json() for s in result.stalls]
            ):
                records.write(json.dumps(line) + "\n")

    summary = summarize(
        options, plan.description, settings, kv_cache_mib, order, runs, plan.reference_system
    )
    write_summary(run_dir, summary)
    all_programs = [p for runs_of in runs.values() for p in runs_of.programs]
    all_requests = [r for runs_of in runs.values() for r in runs_of.requests]
    write_plots(run_dir, list(options.systems), all_programs, all_requests)
    report = write_markdown(run_dir, summary)
    log(f"bench: report at {report}")
    return run_dir


def _also_to_file(log: Log, path: Path) -> Log:
    """The run's console lines, kept next to its results as the raw output."""
    path.write_text("")

    def log_and_keep(line: str) -> None:
        log(line)
        with path.open("a") as console:
            console.write(line + "\n")

    return log_and_keep


def _run_system(
    options: BenchOptions,
    build: Callable[[int], Sequence[Any]],
    name: str,
    repeat: int,
    settings: EngineSettings,
    raw_config: dict[str, Any],
    run_dir: Path,
    runs: dict[str, SystemRuns],
    log: Log,
) -> RunResult | None:
    spec = system_catalog()[name]
    tag = f"{name}-r{repeat}"
    process, endpoint = spec.launch(settings, raw_config, run_dir, tag)
    log(f"bench: starting {name} (repeat {repeat}); log {run_dir / 'logs' / (tag + '.log')}")
    started = time.monotonic()
    try:
        process.start()
        process.wait_ready(endpoint.base_url, settings.served_model_name, _READY_TIMEOUT_S)
        startup = time.monotonic() - started
        log(f"bench: {name} ready in {startup:.0f}s; running {options.workload}")
        draft = (raw_config.get("draft") or {}).get("engine", {}).get("served_model_name")
        result = asyncio.run(
            run_workload(
                build(options.seed),
                endpoint.base_url,
                settings.served_model_name,
                name,
                repeat,
                options.show_progress,
                draft_model=draft if spec.client_speculation else None,
            )
        )
        time.sleep(_METRICS_SETTLE_S)
        metrics_text = scrape_metrics(endpoint.metrics_url)
    except RuntimeError as error:
        log(f"bench: {name} failed: {error}")
        runs[name].error = str(error)
        return None
    finally:
        log(f"bench: stopping {name}")
        process.stop()
    (run_dir / "logs" / f"{tag}.metrics.txt").write_text(metrics_text)
    system_runs = runs[name]
    system_runs.programs += result.programs
    system_runs.requests += result.requests
    system_runs.wall_s += result.wall_s
    system_runs.stalls += result.stalls
    system_runs.startup_s.append(startup)
    returning_turns = sum(request.turn_index > 0 for request in result.requests)
    system_runs.rates.append(reported_rates(metrics_text, returning_turns))
    system_runs.kv_cache_tokens = kv_cache_size_tokens(metrics_text) or system_runs.kv_cache_tokens
    failed = sum(program.error is not None for program in result.programs)
    stalled = [stall.lag_s for stall in result.stalls]
    log(
        f"bench: {name} done in {result.wall_s:.0f}s, {len(result.requests)} requests, "
        f"{failed} failed programs; client stalls: {len(stalled)}, "
        f"longest {max(stalled, default=0.0):.1f}s, total {sum(stalled):.1f}s"
    )
    return result


def _mean_rate(samples: list[dict[str, float | None]], rate: str) -> float | None:
    values = [sample[rate] for sample in samples if sample.get(rate) is not None]
    return sum(values) / len(values) if values else None  # type: ignore[arg-type]


def summarize(
    options: BenchOptions,
    description: str,
    settings: EngineSettings,
    kv_cache_mib: int,
    order: list[str],
    runs: dict[str, SystemRuns],
    reference_system: str | None = None,
) -> dict[str, Any]:
    baseline = runs.get(BASELINE)
    baseline_jct = mean_jct_by_program(baseline.programs) if baseline else None
    systems: dict[str, Any] = {}
    for name, system_runs in runs.items():
        if not system_runs.programs:
            systems[name] = {"error": system_runs.error or "no programs ran"}
            continue
        figures = system_figures(
            system_runs.programs,
            system_runs.requests,
            system_runs.wall_s,
            baseline_jct if name != BASELINE else None,
            system_runs.stalls,
        )
        systems[name] = {
            **figures.__dict__,
            **{rate: _mean_rate(system_runs.rates, rate) for rate in RATE_NAMES},
            "startup_s": system_runs.startup_s,
        }
    ratios: dict[str, Any] = {}
    stock = systems.get(BASELINE, {})
    if "jct_mean_s" in stock:
        for name, figures in systems.items():
            if "jct_mean_s" in figures:
                ratios[name] = {
                    "jct_mean": ratio(stock["jct_mean_s"], figures["jct_mean_s"]),
                    "jct_p90": ratio(stock["jct_p90_s"], figures["jct_p90_s"]),
                    "turn_latency_median": ratio(
                        stock["turn_latency_median_s"], figures["turn_latency_median_s"]
                    ),
                }
    return {
        "command": options.command,
        "workload": options.workload,
        "workload_description": description,
        "size": options.size,
        "seed": options.seed,
        "repeats": options.repeats,
        "order": order,
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "settings": {
            "model": settings.model_path.rsplit("/", 1)[-1],
            "dtype": settings.dtype,
            "enforce_eager": settings.enforce_eager,
            "kv_cache_mib": kv_cache_mib,
            "kv_cache_tokens": next(
                (runs_of.kv_cache_tokens for runs_of in runs.values() if runs_of.kv_cache_tokens),
                None,
            ),
            "max_model_len": settings.max_model_len,
            "block_size": settings.block_size,
            "max_num_seqs": settings.max_num_seqs,
            "cpu_threads_bind": settings.cpu_threads_bind,
        },
        "systems": systems,
        "ratios_vs_stock_vllm": ratios,
        **_time_saved_by_agent_type(runs, reference_system),
    }


def _time_saved_by_agent_type(
    runs: dict[str, SystemRuns], reference_system: str | None
) -> dict[str, Any]:
    """Per agent kind, each system's percent of the reference system's job time
    saved (the speculation workload's kinds differ by tool latency)."""
    reference = runs.get(reference_system) if reference_system else None
    if reference is None or not reference.programs:
        return {}
    kinds = sorted({program.agent_type for program in reference.programs})
    table: dict[str, dict[str, float | None]] = {}
    for name, system_runs in runs.items():
        if name == reference_system or not system_runs.programs:
            continue
        table[name] = {
            kind: time_saved_pct(
                mean_jct_by_program(p for p in system_runs.programs if p.agent_type == kind),
                mean_jct_by_program(p for p in reference.programs if p.agent_type == kind),
            )
            for kind in kinds
        }
    return {"time_saved_by_agent_type_pct": {"reference": reference_system, "systems": table}}


def default_run_name(workload: str, size: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}-{size}"

"""Projections past one machine: many agents on GPU clusters of several sizes,
for stock-like serving, Continuum's policies and toolserve's, by the simulator.

The systems are built from a deployment profile (`configs/gpu-*.yaml`): its
pinning and routing settings are toolserve's, its block size and batch limit
every system's engine shape. A scenario is one cluster size, or the base size
with one setting scaled (KV budget, tool latency, arrival rate); every scenario
simulates the same seeded agents on every system."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.markdown import markdown_table
from bench.report import write_summary
from bench.sim.cluster_agents import cluster_programs
from bench.sim.engine import SimEngineSettings
from bench.sim.profile import StepProfile
from bench.sim.run import SimulatedSystem, simulate_programs
from bench.sim.systems import SimSystem
from cluster.config import ToolserveConfig

GIB = 2**30
PLOTS = {
    "by_size": "jct_by_cluster_size.png",
    "sweeps": "sweeps.png",
}


class ProjectionSettings(BaseModel):
    """What a projection simulates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: int = Field(default=1000, gt=0, description="Agent programs in every scenario.")
    kinds: tuple[str, ...] = Field(
        default=("swe-bench", "bfcl", "agentx-coding"),
        description="Agent kinds in equal shares (bench/sim/cluster_agents.py).",
    )
    arrival_rate_per_s: float = Field(
        default=20.0, ge=0, description="Poisson rate of program arrivals (0: all at once)."
    )
    gpus: tuple[int, ...] = Field(default=(8, 16, 32, 64), description="Cluster sizes.")
    gpus_per_replica: int = Field(default=1, gt=0, description="GPUs of one engine replica.")
    kv_cache_gib: float = Field(gt=0, description="KV cache of one replica.")
    sweep_gpus: int | None = Field(
        default=None, description="The cluster size the sweeps scale settings at (None: none)."
    )
    kv_scales: tuple[float, ...] = Field(default=(0.5, 2.0), description="KV budget sweep.")
    tool_scales: tuple[float, ...] = Field(default=(0.25, 4.0), description="Tool-latency sweep.")
    rate_scales: tuple[float, ...] = Field(default=(0.5, 2.0), description="Arrival-rate sweep.")
    seed: int = Field(default=0, description="Seed of the agents.")


@dataclass(frozen=True)
class Scenario:
    name: str
    gpus: int
    kv_cache_gib: float
    tool_scale: float
    arrival_rate_per_s: float


def scenarios(settings: ProjectionSettings) -> list[Scenario]:
    """Every cluster size at the base settings, then at `sweep_gpus` each sweep."""
    base = [
        Scenario(f"{gpus} GPUs", gpus, settings.kv_cache_gib, 1.0, settings.arrival_rate_per_s)
        for gpus in settings.gpus
    ]
    if settings.sweep_gpus is None:
        return base
    gpus = settings.sweep_gpus
    swept = [
        Scenario(f"KV x{scale:g}", gpus, settings.kv_cache_gib * scale, 1.0,
                 settings.arrival_rate_per_s)
        for scale in settings.kv_scales
    ] + [
        Scenario(f"tools x{scale:g}", gpus, settings.kv_cache_gib, scale,
                 settings.arrival_rate_per_s)
        for scale in settings.tool_scales
    ] + [
        Scenario(f"arrivals x{scale:g}", gpus, settings.kv_cache_gib, 1.0,
                 settings.arrival_rate_per_s * scale)
        for scale in settings.rate_scales
    ]  # fmt: skip
    return base + swept


def projection_systems(config: ToolserveConfig) -> list[SimSystem]:
    """Stock-like serving (LRU prefix cache, request FCFS) behind consistent hashing
    of the session or the least loaded replica; Continuum's policies (pins priced
    from one return-time distribution, program FCFS) behind consistent hashing;
    toolserve's pinning, program FCFS and router as the profile configures them.
    No system drafts: the GPU profiles keep prompt lookup off."""
    pinning = config.main.pinning
    return [
        SimSystem(name="stock, consistent hash", routing="session-hash"),
        SimSystem(name="stock, least loaded", routing="least-loaded"),
        SimSystem(
            name="continuum",
            pinning=pinning.model_copy(update={"durations_by": "single", "program_fcfs": True}),
            routing="session-hash",
        ),
        SimSystem(name="toolserve", pinning=pinning, router=config.routing),
    ]


def engine_settings(
    profile: StepProfile, config: ToolserveConfig, kv_cache_gib: float
) -> SimEngineSettings:
    block_size = config.main.engine.block_size
    tokens = int(kv_cache_gib * GIB) // profile.kv_bytes_per_token
    return SimEngineSettings(
        blocks=tokens // block_size,
        block_size=block_size,
        max_num_seqs=config.main.engine.max_num_seqs,
        max_batched_tokens=profile.max_batched_tokens,
    )


@dataclass(frozen=True)
class ProjectedPoint:
    scenario: str
    gpus: int
    kv_cache_gib: float
    tool_scale: float
    arrival_rate_per_s: float
    figures: SimulatedSystem
    wall_s: float
    """Seconds the simulation took here."""


def _simulate(
    scenario: Scenario,
    system: SimSystem,
    settings: ProjectionSettings,
    profile: StepProfile,
    config: ToolserveConfig,
) -> ProjectedPoint:
    started = time.perf_counter()
    programs = cluster_programs(
        settings.kinds,
        settings.agents,
        scenario.arrival_rate_per_s,
        settings.seed,
        scenario.tool_scale,
    )
    (figures,) = simulate_programs(
        programs,
        [system],
        scenario.gpus // settings.gpus_per_replica,
        engine_settings(profile, config, scenario.kv_cache_gib),
        profile,
        None,
        settings.seed,
    )
    return ProjectedPoint(
        scenario.name,
        scenario.gpus,
        scenario.kv_cache_gib,
        scenario.tool_scale,
        scenario.arrival_rate_per_s,
        figures,
        time.perf_counter() - started,
    )


def project(
    settings: ProjectionSettings,
    profile: StepProfile,
    config: ToolserveConfig,
    workers: int = 2,
    log: Callable[[str], None] = print,
) -> list[ProjectedPoint]:
    """Every scenario on every system, `workers` simulations at a time, each logged
    as it finishes; the points in scenario order, then system order."""
    for gpus in (*settings.gpus, settings.sweep_gpus or settings.gpus_per_replica):
        if gpus % settings.gpus_per_replica:
            raise ValueError(f"{gpus} GPUs is not a whole number of {settings.gpus_per_replica}")
    jobs = [
        (scenario, system)
        for scenario in scenarios(settings)
        for system in projection_systems(config)
    ]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(_simulate, scenario, system, settings, profile, config)
            for scenario, system in jobs
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            point = future.result()
            log(
                f"{done}/{len(futures)}: {point.scenario}, {point.figures.system}: "
                f"mean JCT {point.figures.jct_mean_s:.0f} s ({point.wall_s:.0f} s to simulate)"
            )
        return [future.result() for future in futures]


def points_json(points: Sequence[ProjectedPoint]) -> list[dict[str, Any]]:
    return [asdict(point) for point in points]


def projection_tables(points: Sequence[ProjectedPoint]) -> str:
    headers = [
        "scenario (simulated)",
        "system",
        "replicas",
        "mean JCT",
        "p90 JCT",
        "output tokens/s",
        "prefix hit",
        "preemptions",
        "busiest replica / mean",
    ]
    rows = []
    for point in points:
        figures = point.figures
        rows.append(
            [
                point.scenario,
                figures.system,
                str(figures.replicas),
                f"{figures.jct_mean_s:.0f} s",
                f"{figures.jct_p90_s:.0f} s",
                f"{figures.output_tokens_per_s:.0f}",
                f"{figures.prefix_hit_rate:.1%}",
                str(figures.preemptions),
                f"{figures.busiest_replica_share * figures.replicas:.2f}",
            ]
        )
    return "\n".join(markdown_table(headers, rows)) + "\n"


def write_projection_plots(run_dir: Path, points: Sequence[ProjectedPoint]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(point.figures.system for point in points))
    by_size = [point for point in points if point.scenario.endswith(" GPUs")]
    figure, grid = plt.subplots(1, 3, figsize=(14, 4.2))
    panels: tuple[tuple[str, Callable[[SimulatedSystem], float]], ...] = (
        ("mean JCT (s)", lambda f: f.jct_mean_s),
        ("prefix-cache hit rate", lambda f: f.prefix_hit_rate),
        ("busiest replica / mean", lambda f: f.busiest_replica_share * f.replicas),
    )
    for axes, (label, value) in zip(grid, panels, strict=True):
        for system in systems:
            mine = [point for point in by_size if point.figures.system == system]
            axes.plot(
                [point.gpus for point in mine],
                [value(point.figures) for point in mine],
                marker="o",
                label=system,
            )
        axes.set(xlabel="GPUs", ylabel=label, xscale="log")
        axes.minorticks_off()
        axes.set_xticks(sorted({point.gpus for point in by_size}))
        axes.set_xticklabels([str(gpus) for gpus in sorted({point.gpus for point in by_size})])
        axes.grid(alpha=0.3)
    grid[0].legend(fontsize=8)
    figure.suptitle("Simulated: by cluster size")
    figure.tight_layout()
    figure.savefig(run_dir / PLOTS["by_size"], dpi=110)
    plt.close(figure)

    swept = [point for point in points if not point.scenario.endswith(" GPUs")]
    if not swept:
        return
    names = list(dict.fromkeys(point.scenario for point in swept))
    figure, axes = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(systems)
    for offset, system in enumerate(systems):
        values = {
            point.scenario: point.figures.jct_mean_s
            for point in swept
            if point.figures.system == system
        }
        axes.bar(
            [index + offset * width for index in range(len(names))],
            [values.get(name, 0.0) for name in names],
            width=width,
            label=system,
        )
    axes.set_xticks([index + width * (len(systems) - 1) / 2 for index in range(len(names))])
    axes.set_xticklabels(names)
    axes.set(ylabel="mean JCT (s)", title=f"Simulated: sweeps at {swept[0].gpus} GPUs")
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(run_dir / PLOTS["sweeps"], dpi=110)
    plt.close(figure)


def write_projection(
    run_dir: Path,
    points: Sequence[ProjectedPoint],
    header: dict[str, Any],
    report_intro: str,
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(run_dir, {**header, "points": points_json(points)})
    write_projection_plots(run_dir, points)
    plots = "".join(
        f"![{name}]({file})\n" for name, file in PLOTS.items() if (run_dir / file).exists()
    )
    (run_dir / "report.md").write_text(f"{report_intro}\n\n{projection_tables(points)}\n{plots}")

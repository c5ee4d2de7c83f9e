"""A recorded run, simulated: every arm's rounds replayed turn by turn (the
prompt and output tokens and pauses its agents saw) on engines shaped as the
run's, with the arm's policies, and set beside what was measured."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.markdown import markdown_table
from bench.report import write_summary
from bench.sim.agents import recorded_programs
from bench.sim.drafts import DraftRates
from bench.sim.engine import SimEngineSettings
from bench.sim.profile import StepProfile
from bench.sim.simulation import SimResult, Simulation
from bench.sim.systems import recorded_replicas, recorded_system

DRAFT_WINDOW = 4


@dataclass(frozen=True)
class ArmComparison:
    run: str
    system: str
    measured_jct_s: float
    simulated_jct_s: float
    measured_prefix_hit: float | None
    simulated_prefix_hit: float
    measured_preemptions: float | None
    simulated_preemptions: float

    @property
    def jct_error(self) -> float:
        return self.simulated_jct_s / self.measured_jct_s - 1


@dataclass(frozen=True)
class RatioComparison:
    run: str
    system: str
    reference: str
    measured: float
    simulated: float

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1


def draft_rates(summary: dict[str, Any]) -> DraftRates | None:
    """The n-gram proposer's rates as a run's counters give them: from an arm
    that verified every proposal where there is one, else from any that drafted
    (steps that produced 1 + accepted tokens each)."""
    works = {name: figures.get("work", {}) for name, figures in summary["systems"].items()}
    effective = summary.get("effective_configuration", {})
    ungated = [
        name
        for name in works
        if "--speculative-config" in effective.get(name, {}).get("command", [])
    ]
    for name in [*ungated, *works]:
        work = works[name]
        drafted = (work.get("draft_tokens") or {}).get("mean")
        accepted = (work.get("accepted_draft_tokens") or {}).get("mean")
        generated = (work.get("generation_tokens") or {}).get("mean")
        if not drafted or accepted is None or not generated:
            continue
        steps = max(1.0, generated - accepted)
        return DraftRates.measured(drafted / (DRAFT_WINDOW * steps), accepted / drafted)
    return None


def simulate_run(
    run_dir: Path, profile: StepProfile, seed: int = 0
) -> tuple[list[ArmComparison], list[RatioComparison]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    settings = summary["settings"]
    kv_tokens = settings.get("kv_cache_tokens") or (
        settings["kv_cache_mib"] * 2**20 // profile.kv_bytes_per_token
    )
    shape = SimEngineSettings(
        blocks=kv_tokens // settings["block_size"],
        block_size=settings["block_size"],
        max_num_seqs=settings["max_num_seqs"],
        max_batched_tokens=profile.max_batched_tokens,
    )
    rates = draft_rates(summary)
    rounds = summary["rounds"]
    simulated_means: dict[str, list[float]] = {}
    arms = []
    for name, figures in summary["systems"].items():
        if "error" in figures:
            continue
        effective = summary["effective_configuration"][name]
        work = figures.get("work", {})
        drafted = bool((work.get("draft_tokens") or {}).get("mean"))
        system = recorded_system(name, effective, drafted)
        results: list[SimResult] = []
        replicas = recorded_replicas(effective)
        for repeat in range(rounds):
            programs = recorded_programs(run_dir, name, repeat)
            engines = system.engines(replicas, shape, profile.step_time, rates, seed)
            router = system.new_router(shape.max_num_seqs)
            # Every recorded run's replicas shared one machine's cores.
            simulation = Simulation(engines, router, shared_cores=replicas > 1)
            results.append(simulation.run(programs))
        simulated_means[name] = [result.jct_mean_s for result in results]
        arms.append(
            ArmComparison(
                run=run_dir.name,
                system=name,
                measured_jct_s=figures["jct_mean_s"],
                simulated_jct_s=statistics.fmean(simulated_means[name]),
                measured_prefix_hit=figures.get("engine_prefix_hit_rate"),
                simulated_prefix_hit=statistics.fmean(r.prefix_hit_rate for r in results),
                measured_preemptions=(work.get("preemptions") or {}).get("mean"),
                simulated_preemptions=statistics.fmean(r.preemptions for r in results),
            )
        )
    ratios = []
    for entry in summary["comparisons"]:
        measured = (entry.get("jct_mean") or {}).get("estimate")
        system, reference = entry["system"], entry["reference"]
        if measured is None or system not in simulated_means or reference not in simulated_means:
            continue
        simulated = statistics.fmean(simulated_means[reference]) / statistics.fmean(
            simulated_means[system]
        )
        ratios.append(RatioComparison(run_dir.name, system, reference, measured, simulated))
    return arms, ratios


def validation_tables(arms: list[ArmComparison], ratios: list[RatioComparison]) -> str:
    arm_rows = [
        [
            arm.run,
            arm.system,
            f"{arm.measured_jct_s:.1f} s",
            f"{arm.simulated_jct_s:.1f} s",
            f"{arm.jct_error:+.0%}",
            _share(arm.measured_prefix_hit),
            _share(arm.simulated_prefix_hit),
            "n/a" if arm.measured_preemptions is None else f"{arm.measured_preemptions:.0f}",
            f"{arm.simulated_preemptions:.0f}",
        ]
        for arm in arms
    ]
    ratio_rows = [
        [
            ratio.run,
            ratio.system,
            ratio.reference,
            f"{ratio.measured:.2f}x",
            f"{ratio.simulated:.2f}x",
            f"{ratio.error:+.0%}",
        ]
        for ratio in ratios
    ]
    lines = markdown_table(
        [
            "run",
            "system",
            "measured mean JCT",
            "simulated",
            "error",
            "measured prefix hit",
            "simulated",
            "measured preemptions",
            "simulated",
        ],
        arm_rows,
    )
    lines += [""]
    lines += markdown_table(
        ["run", "system", "reference", "measured JCT ratio", "simulated", "error"], ratio_rows
    )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RunError:
    """How well one run was reproduced: whether the simulation orders its systems
    by mean JCT as measured, and the largest errors."""

    run: str
    ranking_reproduced: bool
    largest_ratio_error: float | None
    largest_jct_error: float


def run_errors(arms: list[ArmComparison], ratios: list[RatioComparison]) -> list[RunError]:
    errors = []
    for run in dict.fromkeys(arm.run for arm in arms):
        mine = [arm for arm in arms if arm.run == run]
        measured = sorted(mine, key=lambda arm: arm.measured_jct_s)
        simulated = sorted(mine, key=lambda arm: arm.simulated_jct_s)
        ratio_errors = [abs(ratio.error) for ratio in ratios if ratio.run == run]
        errors.append(
            RunError(
                run=run,
                ranking_reproduced=[arm.system for arm in measured]
                == [arm.system for arm in simulated],
                largest_ratio_error=max(ratio_errors) if ratio_errors else None,
                largest_jct_error=max(abs(arm.jct_error) for arm in mine),
            )
        )
    return errors


def run_error_table(errors: list[RunError]) -> str:
    rows = [
        [
            error.run,
            "yes" if error.ranking_reproduced else "no",
            "n/a" if error.largest_ratio_error is None else f"{error.largest_ratio_error:.0%}",
            f"{error.largest_jct_error:.0%}",
        ]
        for error in errors
    ]
    headers = ["run", "ranking by mean JCT reproduced", "largest JCT-ratio error",
               "largest mean-JCT error"]  # fmt: skip
    return "\n".join(markdown_table(headers, rows)) + "\n"


def validation_report(arms: list[ArmComparison], ratios: list[RatioComparison]) -> str:
    return validation_tables(arms, ratios) + "\n" + run_error_table(run_errors(arms, ratios))


def write_validation(
    run_dir: Path,
    arms: list[ArmComparison],
    ratios: list[RatioComparison],
    header: dict[str, Any],
    intro: str,
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(run_dir, {**header, **validation_json(arms, ratios)})
    (run_dir / "report.md").write_text(f"{intro}\n\n{validation_report(arms, ratios)}")


def validation_json(arms: list[ArmComparison], ratios: list[RatioComparison]) -> dict[str, Any]:
    return {
        "arms": [{**asdict(arm), "jct_error": arm.jct_error} for arm in arms],
        "ratios": [{**asdict(ratio), "error": ratio.error} for ratio in ratios],
        "runs": [asdict(error) for error in run_errors(arms, ratios)],
    }


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"

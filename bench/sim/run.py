"""A workload's programs, simulated on each system's replicas: the figures the
benchmark reports (mean and p90 JCT, engine prefix-cache hits, preemptions)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.markdown import markdown_table
from bench.sim.agents import replay_programs
from bench.sim.drafts import DraftRates
from bench.sim.engine import SimEngineSettings
from bench.sim.profile import StepProfile
from bench.sim.simulation import SimProgram, SimResult, Simulation
from bench.sim.systems import SimSystem
from bench.workloads.program import AgentProgram


@dataclass(frozen=True)
class SimulatedSystem:
    system: str
    replicas: int
    programs: int
    jct_mean_s: float
    jct_p90_s: float
    prefix_hit_rate: float
    preemptions: int
    busiest_replica_share: float
    """The busiest replica's share of all engine-busy seconds (1/replicas: even)."""
    output_tokens_per_s: float
    """Tokens the programs decoded, over the time from the first arrival to the last finish."""


def engine_shape(profile: StepProfile, kv_cache_mib: int) -> SimEngineSettings:
    tokens = kv_cache_mib * 2**20 // profile.kv_bytes_per_token
    return SimEngineSettings(
        blocks=tokens // profile.block_size,
        block_size=profile.block_size,
        max_num_seqs=profile.max_num_seqs,
        max_batched_tokens=profile.max_batched_tokens,
    )


def simulate_programs(
    programs: Sequence[SimProgram],
    systems: Sequence[SimSystem],
    replicas: int,
    shape: SimEngineSettings,
    profile: StepProfile,
    rates: DraftRates | None,
    seed: int,
) -> list[SimulatedSystem]:
    figures = []
    for system in systems:
        engines = system.engines(replicas, shape, profile.step_time, rates, seed)
        result = Simulation(engines, system.new_router(shape.max_num_seqs)).run(programs)
        jcts = sorted(o.jct_s for o in result.programs if o.jct_s is not None)
        busy = [counters.busy_s for counters in result.engines.values()]
        figures.append(
            SimulatedSystem(
                system=system.name,
                replicas=replicas,
                programs=len(jcts),
                jct_mean_s=statistics.fmean(jcts),
                jct_p90_s=jcts[min(len(jcts) - 1, int(0.9 * len(jcts)))],
                prefix_hit_rate=result.prefix_hit_rate,
                preemptions=result.preemptions,
                busiest_replica_share=max(busy) / sum(busy) if sum(busy) else 0.0,
                output_tokens_per_s=_output_rate(result),
            )
        )
    return figures


def _output_rate(result: SimResult) -> float:
    decoded = sum(turn.output_tokens for outcome in result.programs for turn in outcome.turns)
    start = min((outcome.arrival_s for outcome in result.programs), default=0.0)
    span = result.end_s - start
    return decoded / span if span > 0 else 0.0


def simulate_replay(
    built: Sequence[AgentProgram],
    systems: Sequence[SimSystem],
    replicas: int,
    profile: StepProfile,
    kv_cache_mib: int,
    rates: DraftRates | None,
    seed: int,
) -> list[SimulatedSystem]:
    """`built`: what a replay workload's plan built for the seed."""
    programs = replay_programs(built)
    return simulate_programs(
        programs, systems, replicas, engine_shape(profile, kv_cache_mib), profile, rates, seed
    )


def simulated_table(figures: Sequence[SimulatedSystem]) -> str:
    rows = [
        [
            figure.system,
            str(figure.replicas),
            str(figure.programs),
            f"{figure.jct_mean_s:.1f} s",
            f"{figure.jct_p90_s:.1f} s",
            f"{figure.prefix_hit_rate:.1%}",
            str(figure.preemptions),
            f"{figure.busiest_replica_share:.0%}",
        ]
        for figure in figures
    ]
    headers = [
        "system (simulated)",
        "replicas",
        "programs",
        "mean JCT",
        "p90 JCT",
        "prefix hit",
        "preemptions",
        "busiest replica's share",
    ]
    return "\n".join(markdown_table(headers, rows)) + "\n"

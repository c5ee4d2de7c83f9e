"""The hot-path workload: what the serving layer costs per request, apart from
the engine. One-token completions, first one at a time, then with a fixed
number in flight (each client sends its next request when its reply arrives),
then streamed one at a time for the time to the first token. Every request
asks a different question, so no cache answers it; the prefix cache holds
their shared opening on every system alike. The repeated-prompt workload runs
one phase of its own instead: one question asked again and again, one at a
time (greedy), the case of toolserve's response cache. The burst workload runs
bursts: a team of agents sharing one long preamble (system prompt and tool
schemas) sends its requests at once, then the next team (another preamble).

Figures per run: p50 and p99 latency of each phase, requests per second of the
concurrent phases, time to first token of the streamed phase; the harness adds
CPU milliseconds per request of the serving processes and of the engine. Per
comparison: the latency the system adds to the reference's (milliseconds) and
its throughput and CPU relative to the reference's, round by round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bench.stats import Interval, mean_interval, round_ratio_interval
from bench.workloads.plan import Size, WorkloadPlan

AGENT_TYPE = "hot-path"
SEQUENTIAL = "sequential"
STREAMED = "streamed"
REPEATED = "repeated"
BURST = "burst"
ADDED = "added_ms"
RATIO = "ratio"


class HotPathConfig(BaseModel):
    """Phases of the hot-path workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sequential_requests: int = Field(
        default=0, ge=0, description="One-token completions sent one at a time."
    )
    concurrency: tuple[int, ...] = Field(
        default=(), description="Requests in flight in each concurrent phase (one phase per value)."
    )
    requests_per_phase: int = Field(
        default=0, ge=0, description="Requests of each concurrent phase."
    )
    streamed_requests: int = Field(
        default=0,
        ge=0,
        description="Streamed completions sent one at a time, for the first token's time.",
    )
    streamed_max_tokens: int = Field(default=16, gt=0, description="Tokens of a streamed reply.")
    repeated_requests: int = Field(
        default=0, ge=0, description="Completions of one and the same question, one at a time."
    )
    repeated_max_tokens: int = Field(
        default=32, gt=0, description="Tokens of a repeated question's reply."
    )
    burst_width: int = Field(
        default=0, ge=0, description="Requests of one burst, sent at once (one per agent)."
    )
    burst_iterations: int = Field(
        default=0,
        ge=0,
        description="Bursts, one after another; each burst's agents share a preamble "
        "of their own (a team), so no burst finds its preamble cached.",
    )
    burst_max_tokens: int = Field(default=32, gt=0, description="Tokens of a burst reply.")


def concurrent_phase(in_flight: int) -> str:
    return f"c{in_flight}"


def phases(config: HotPathConfig) -> list[str]:
    """The phases that send requests, in the order they run."""
    concurrent = [concurrent_phase(c) for c in config.concurrency if config.requests_per_phase]
    return [
        *([SEQUENTIAL] if config.sequential_requests else []),
        *concurrent,
        *([STREAMED] if config.streamed_requests else []),
        *([REPEATED] if config.repeated_requests else []),
        *([BURST] if config.burst_width and config.burst_iterations else []),
    ]


def figure_names(config: HotPathConfig) -> list[str]:
    names = []
    for phase in phases(config):
        names += [f"{phase}_p50_ms", f"{phase}_p99_ms"]
        if phase not in (SEQUENTIAL, STREAMED, REPEATED, BURST):
            names.append(f"{phase}_requests_per_s")
    return [
        *names,
        *(["ttft_p50_ms", "ttft_p99_ms"] if config.streamed_requests else []),
        "serving_cpu_ms_per_request",
        "engine_cpu_ms_per_request",
    ]


def latency_figures(phase: str, latencies_s: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of a phase's latencies, in milliseconds (none without latencies)."""
    if not latencies_s:
        return {}
    p50, p99 = np.percentile(np.asarray(latencies_s, dtype=float) * 1000, [50, 99])
    return {f"{phase}_p50_ms": float(p50), f"{phase}_p99_ms": float(p99)}


def throughput_figure(phase: str, completed: int, wall_s: float) -> dict[str, float]:
    return {f"{phase}_requests_per_s": completed / wall_s} if wall_s > 0 and completed else {}


def cpu_figures(requests: int, total_cpu_s: float, engine_cpu_s: float) -> dict[str, float]:
    """CPU milliseconds per request: the serving processes (everything of the
    system's process tree but its engine processes) and the engine."""
    if requests <= 0:
        return {}
    return {
        "serving_cpu_ms_per_request": 1000 * (total_cpu_s - engine_cpu_s) / requests,
        "engine_cpu_ms_per_request": 1000 * engine_cpu_s / requests,
    }


def _interval_json(interval: Interval | None, per_round: list[float]) -> dict[str, object]:
    bounds = (
        interval.as_json()
        if interval
        else {"estimate": per_round[0] if per_round else None, "low": None, "high": None}
    )
    return {**bounds, "per_round": per_round}


def compare(
    reference: Sequence[Mapping[str, float]],
    system: Sequence[Mapping[str, float]],
    names: Sequence[str],
) -> dict[str, dict[str, object]]:
    """Round by round (`reference[r]`, `system[r]`: figures of round r): a latency
    (`_ms` but not CPU) as milliseconds added to the reference's, everything else
    as the system's figure over the reference's. A burst's latencies are ratios:
    they are the engine's work, not the serving layer's addition to it."""
    comparison: dict[str, dict[str, object]] = {}
    for name in names:
        rounds = [
            (ref[name], own[name])
            for ref, own in zip(reference, system, strict=True)
            if name in ref and name in own and ref[name] > 0
        ]
        if not rounds:
            continue
        if name.endswith("_ms") and "cpu" not in name and not name.startswith(BURST):
            added = [own - ref for ref, own in rounds]
            comparison[name] = {"kind": ADDED, **_interval_json(mean_interval(added), added)}
        else:
            ratios = [own / ref for ref, own in rounds]
            interval = round_ratio_interval(ratios)
            comparison[name] = {"kind": RATIO, **_interval_json(interval, ratios)}
    return comparison


def hot_path_plan(size: Size) -> WorkloadPlan:
    config = (
        HotPathConfig(
            sequential_requests=30, concurrency=(8, 32), requests_per_phase=64, streamed_requests=20
        )
        if size == "quick"
        else HotPathConfig(
            sequential_requests=100,
            concurrency=(8, 32, 128),
            requests_per_phase=256,
            streamed_requests=50,
        )
    )
    return WorkloadPlan(
        name="hot-path",
        size=size,
        description=(
            f"the serving layer's cost per request: {config.sequential_requests} one-token "
            f"completions one at a time, {config.requests_per_phase} with "
            + ", ".join(str(c) for c in config.concurrency)
            + f" in flight, {config.streamed_requests} streamed one at a time (time to "
            "first token); no tools, no session"
        ),
        build=lambda seed: [],
        kv_cache_mib=128,
        max_model_len=2048,
        hot_path=config,
    )


def burst_plan(size: Size) -> WorkloadPlan:
    config = HotPathConfig(burst_width=8, burst_iterations=5 if size == "quick" else 10)
    return WorkloadPlan(
        name="burst",
        size=size,
        description=(
            f"{config.burst_iterations} bursts of {config.burst_width} requests sent at "
            "once, one burst after another: each burst a team of agents sharing a preamble "
            "of their own (a long system prompt and eight tool schemas: prompts of about "
            "1,170 tokens with SmolLM2's template), each "
            f"agent asking its own question, greedy, up to {config.burst_max_tokens} tokens "
            "per reply, no session. Latency at the API (p50, p99 over all bursts)"
        ),
        build=lambda seed: [],
        kv_cache_mib=384,
        max_model_len=4096,
        hot_path=config,
    )


def repeated_prompt_plan(size: Size) -> WorkloadPlan:
    config = HotPathConfig(repeated_requests=50 if size == "quick" else 200)
    return WorkloadPlan(
        name="repeated-prompt",
        size=size,
        description=(
            f"one question asked {config.repeated_requests} times, one at a time, greedy, "
            f"up to {config.repeated_max_tokens} tokens per reply, no session: toolserve "
            "answers every repeat from its response cache; vLLM's server decodes each "
            "again, its prefix cache holding the prompt. Latency at the API (p50, p99)"
        ),
        build=lambda seed: [],
        kv_cache_mib=128,
        max_model_len=2048,
        hot_path=config,
    )

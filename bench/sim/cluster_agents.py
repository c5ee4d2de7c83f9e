"""Agents at cluster scale, for projections: the trace-replay generator's own
programs (`bench/workloads/replay.py`), with contexts a GPU-served 128k-token
model holds, which no CPU run can replay.

Kinds (sources; per-turn token counts are assumptions where the sources give
none, stated beside each):
- `swe-bench`: Continuum's SWE-bench statistics (arXiv 2511.02230, Table 1):
  10.9 ± 2.1 turns, tool pauses 925 ± 3550 ms. Contexts of 20-90k tokens, as
  the issue's projection asks and SWE-bench agents reach: a 16k-token first
  prompt (repository map, instructions), then 5k ± 4k tokens a turn (file
  reads, test logs; assumed), 150 ± 100 tokens written (assumed).
- `bfcl`: Continuum's BFCL v4 statistics (same table): 6.3 ± 2.3 turns, pauses
  1923 ± 2133 ms; a 20k-token first prompt (tool documentation and history;
  assumed), 1.5k ± 1k a turn, 60 ± 40 written (assumed).
- `agentx-coding`: coding agents as vLLM's AgentX write-up (2026-09) describes
  them: a median of 43 turns and contexts growing toward the model's limit;
  turns 43 ± 15, a 10k-token first prompt, 1.8k ± 2k a turn, 100 ± 80 written
  (assumed), calling the trace-replay-tools coding mix (read_file ~50 ms,
  edit_file ~0.1 s, search_code ~0.4 s, run_tests ~8 s).
Every program ends before a turn would pass `MAX_CONTEXT` tokens.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from bench.sim.agents import replay_programs
from bench.sim.simulation import SimProgram
from bench.workloads.distributions import Distribution
from bench.workloads.replay import (
    CODING_TOOLS_PROFILE,
    ReplayConfig,
    ReplayProfile,
    generate_replay,
)
from bench.workloads.trace import BFCL_V4_PROFILE, SWE_BENCH_PROFILE

MAX_CONTEXT = 120_000
"""Below Llama-3.1's 131,072-token window, with room for the last reply."""


def _lognormal(mean: float, sd: float, low: float, high: float) -> Distribution:
    return Distribution(kind="lognormal", mean=mean, sd=sd, low=low, high=high)


SWE_BENCH_AGENT = ReplayProfile(
    name="swe-bench",
    share=1.0,
    turns=SWE_BENCH_PROFILE.turns,
    first_prompt_tokens=16_000,
    appended_tokens=_lognormal(5000, 4000, 200, 20_000),
    output_tokens=_lognormal(150, 100, 16, 1000),
    tool_pause_s=SWE_BENCH_PROFILE.tool_latency_s,
)
BFCL_AGENT = ReplayProfile(
    name="bfcl",
    share=1.0,
    turns=BFCL_V4_PROFILE.turns,
    first_prompt_tokens=20_000,
    appended_tokens=_lognormal(1500, 1000, 50, 8000),
    output_tokens=_lognormal(60, 40, 8, 400),
    tool_pause_s=BFCL_V4_PROFILE.tool_latency_s,
)
AGENTX_CODING_AGENT = CODING_TOOLS_PROFILE.model_copy(
    update={
        "name": "agentx-coding",
        "turns": Distribution(kind="normal", mean=43, sd=15, low=5),
        "first_prompt_tokens": 10_000,
        "appended_tokens": _lognormal(1800, 2000, 50, 20_000),
        "output_tokens": _lognormal(100, 80, 12, 800),
    }
)
KINDS = {kind.name: kind for kind in (SWE_BENCH_AGENT, BFCL_AGENT, AGENTX_CODING_AGENT)}


def _no_text(rng: random.Random, count: int) -> str:
    """The simulator counts tokens; it needs no text."""
    return ""


def cluster_programs(
    kinds: Sequence[str],
    programs: int,
    arrival_rate_per_s: float,
    seed: int,
    tool_scale: float = 1.0,
) -> list[SimProgram]:
    """`programs` agents of `kinds` (equal shares) arriving at the Poisson rate
    (0: all at once), every tool pause times `tool_scale`."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown agent kinds {unknown}; known: {', '.join(KINDS)}")
    config = ReplayConfig(
        programs=programs,
        arrival_rate_per_s=arrival_rate_per_s,
        max_context=MAX_CONTEXT,
        profiles=tuple(KINDS[kind] for kind in kinds),
    )
    simulated = replay_programs(generate_replay(config, seed, _no_text))
    if tool_scale == 1.0:
        return simulated
    return [
        dataclasses.replace(
            program,
            turns=tuple(
                dataclasses.replace(turn, pause_s=turn.pause_s * tool_scale)
                for turn in program.turns
            ),
        )
        for program in simulated
    ]

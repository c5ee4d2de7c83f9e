"""Benchmark workloads by name and size: each family's module plans its own."""

from __future__ import annotations

from collections.abc import Callable

from bench.workloads.aiperf import aiperf_multi_turn_plan
from bench.workloads.bfcl import bfcl_plan
from bench.workloads.bfcl_speculation import bfcl_speculation_plan
from bench.workloads.client_agents import client_agents_plan
from bench.workloads.codegen import codegen_plan
from bench.workloads.conveyor import conveyor_plan
from bench.workloads.hot_path import burst_plan, hot_path_plan, repeated_prompt_plan
from bench.workloads.plan import SIZES, Size, WorkloadPlan
from bench.workloads.replay import trace_replay_plan, trace_replay_tools_plan
from bench.workloads.speculation import speculation_plan
from bench.workloads.trace import many_agent_plan
from bench.workloads.workflows import workflow_plan

__all__ = ["PROGRAM_COUNT_WORKLOADS", "SIZES", "WORKLOADS", "Size", "WorkloadPlan", "plan_workload"]

WORKLOADS: dict[str, Callable[[Size], WorkloadPlan]] = {
    "many-agent": many_agent_plan,
    "trace-replay": trace_replay_plan,
    "trace-replay-tools": trace_replay_tools_plan,
    "bugfix-6": lambda size: workflow_plan("bugfix-6", size),
    "coding-35": lambda size: workflow_plan("coding-35", size),
    "bfcl": bfcl_plan,
    "codegen": codegen_plan,
    "speculation": speculation_plan,
    "bfcl-speculation": bfcl_speculation_plan,
    "aiperf-multi-turn": aiperf_multi_turn_plan,
    "hot-path": hot_path_plan,
    "repeated-prompt": repeated_prompt_plan,
    "burst": burst_plan,
    "conveyor": conveyor_plan,
    "client-agents": client_agents_plan,
}


PROGRAM_COUNT_WORKLOADS: dict[str, Callable[[Size, int | None], WorkloadPlan]] = {
    "many-agent": many_agent_plan,
    "trace-replay": trace_replay_plan,
    "trace-replay-tools": trace_replay_tools_plan,
}
"""The workloads sized by a count of programs, which `--programs` can change."""


def plan_workload(name: str, size: Size, programs: int | None = None) -> WorkloadPlan:
    """`programs`: that many a round instead of the size's own count, for the
    workloads in PROGRAM_COUNT_WORKLOADS; any other refuses it."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    if programs is None:
        return WORKLOADS[name](size)
    if name not in PROGRAM_COUNT_WORKLOADS:
        raise ValueError(
            f"--programs applies to the workloads sized by their programs "
            f"({', '.join(PROGRAM_COUNT_WORKLOADS)}), not to {name!r}"
        )
    return PROGRAM_COUNT_WORKLOADS[name](size, programs)

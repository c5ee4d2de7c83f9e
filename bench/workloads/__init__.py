"""Benchmark workloads by name and size: each family's module plans its own."""

from __future__ import annotations

from collections.abc import Callable

from bench.workloads.aiperf import aiperf_multi_turn_plan
from bench.workloads.bfcl import bfcl_plan
from bench.workloads.bfcl_speculation import bfcl_speculation_plan
from bench.workloads.codegen import codegen_plan
from bench.workloads.conveyor import conveyor_plan
from bench.workloads.hot_path import burst_plan, hot_path_plan, repeated_prompt_plan
from bench.workloads.plan import SIZES, Size, WorkloadPlan
from bench.workloads.replay import trace_replay_plan
from bench.workloads.speculation import speculation_plan
from bench.workloads.trace import many_agent_plan
from bench.workloads.workflows import workflow_plan

__all__ = ["SIZES", "WORKLOADS", "Size", "WorkloadPlan", "plan_workload"]

WORKLOADS: dict[str, Callable[[Size], WorkloadPlan]] = {
    "many-agent": many_agent_plan,
    "trace-replay": trace_replay_plan,
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
}


def plan_workload(name: str, size: Size) -> WorkloadPlan:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name](size)

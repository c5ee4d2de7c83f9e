"""A benchmark run's options, as `toolserve bench` takes them: the workload, its
size and programs a round, the systems compared (each `NAME` or
`NAME@PATH=VALUE@...`), rounds, seeds and where the run is written."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.workloads import Size

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
    programs: int | None = None
    """Programs a round instead of the size's own count (`--programs`; the
    workloads sized by their programs only)."""
    nodes: bool = False
    """Every system on the hosts of `toolserve nodes` (`--nodes`)."""


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


def default_run_name(workload: str, size: str, programs: int | None = None) -> str:
    """Time, workload and size, and the programs a round where `--programs` set them."""
    count = f"-{programs}-programs" if programs is not None else ""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}-{size}{count}"

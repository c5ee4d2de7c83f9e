"""Projections: agents at cluster scale from the trace-replay generator, the
systems built from a deployment profile, and a recorded projection's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.cluster_agents import MAX_CONTEXT, cluster_programs
from bench.sim.profile import StepProfile
from bench.sim.projection import (
    PLOTS,
    ProjectionSettings,
    engine_settings,
    project,
    projection_systems,
    scenarios,
    write_projection,
)
from cluster.config import REPO_ROOT, load_config

GPU_CONFIG = REPO_ROOT / "configs" / "gpu-llama-3.1-8b.yaml"
GPU_PROFILE = REPO_ROOT / "bench" / "sim" / "profiles" / "llama-3.1-8b-h100.json"


def test_cluster_agents_are_seeded_and_stay_within_the_models_window() -> None:
    programs = cluster_programs(["swe-bench", "bfcl", "agentx-coding"], 60, 2.0, seed=4)
    assert programs == cluster_programs(["swe-bench", "bfcl", "agentx-coding"], 60, 2.0, seed=4)
    assert {program.agent_type for program in programs} == {"swe-bench", "bfcl", "agentx-coding"}
    for program in programs:
        context = program.first_prompt_tokens
        for turn in program.turns:
            context += turn.appended_tokens + turn.output_tokens
        assert context <= MAX_CONTEXT + 200, program.program_id  # the template's markup
    coding = [program for program in programs if program.agent_type == "agentx-coding"]
    assert max(len(program.turns) for program in coding) > 20
    swe = [program for program in programs if program.agent_type == "swe-bench"]
    assert all(program.first_prompt_tokens >= 16_000 for program in swe)


def test_a_tool_scale_stretches_every_pause_and_nothing_else() -> None:
    plain = cluster_programs(["bfcl"], 10, 1.0, seed=1)
    slow = cluster_programs(["bfcl"], 10, 1.0, seed=1, tool_scale=4.0)
    for one, other in zip(plain, slow, strict=True):
        assert other.arrival_s == one.arrival_s
        for turn, stretched in zip(one.turns, other.turns, strict=True):
            assert stretched.pause_s == pytest.approx(4 * turn.pause_s)
            assert stretched.appended_tokens == turn.appended_tokens


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown agent kinds"):
        cluster_programs(["chatbot"], 1, 1.0, seed=0)


def test_the_sweeps_scale_one_setting_at_their_cluster_size() -> None:
    settings = ProjectionSettings(gpus=(8, 16), kv_cache_gib=40, sweep_gpus=16)
    named = {scenario.name: scenario for scenario in scenarios(settings)}
    assert [name for name in named if name.endswith("GPUs")] == ["8 GPUs", "16 GPUs"]
    assert named["KV x0.5"].kv_cache_gib == 20 and named["KV x0.5"].gpus == 16
    assert named["tools x4"].tool_scale == 4 and named["tools x4"].kv_cache_gib == 40
    assert named["arrivals x2"].arrival_rate_per_s == 2 * settings.arrival_rate_per_s


def test_the_systems_take_toolserves_settings_from_the_deployment_profile() -> None:
    config = load_config(GPU_CONFIG)
    systems = {system.name: system for system in projection_systems(config)}
    toolserve = systems["toolserve"]
    assert toolserve.pinning == config.main.pinning and toolserve.routing == "toolserve"
    continuum = systems["continuum"].pinning
    assert continuum is not None and continuum.durations_by == "single"
    assert continuum.program_fcfs and systems["continuum"].routing == "session-hash"
    assert systems["stock, consistent hash"].pinning is None
    assert all(system.drafts == "none" for system in systems.values())
    shape = engine_settings(StepProfile.load(GPU_PROFILE), config, kv_cache_gib=1.0)
    assert shape.block_size == config.main.engine.block_size
    assert shape.blocks == 2**30 // 131072 // config.main.engine.block_size


def test_a_projection_simulates_every_system_and_records_its_report(tmp_path: Path) -> None:
    config = load_config(GPU_CONFIG)
    settings = ProjectionSettings(
        agents=6, kinds=("bfcl",), gpus=(2, 4), kv_cache_gib=8, sweep_gpus=2,
        kv_scales=(0.5,), tool_scales=(), rate_scales=(),
    )  # fmt: skip
    points = project(settings, StepProfile.load(GPU_PROFILE), config, workers=1)
    assert [(point.scenario, point.figures.system) for point in points] == [
        (scenario, system.name)
        for scenario in ("2 GPUs", "4 GPUs", "KV x0.5")
        for system in projection_systems(config)
    ]
    for point in points:
        assert point.figures.programs == 6, point
        assert point.figures.jct_mean_s > 0 and point.figures.output_tokens_per_s > 0
    write_projection(tmp_path / "run", points, {"settings": settings.model_dump()}, "# Simulated")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["points"]) == len(points)
    report = (tmp_path / "run" / "report.md").read_text()
    for plot in PLOTS.values():
        assert (tmp_path / "run" / plot).read_bytes().startswith(b"\x89PNG")
        assert f"]({plot})" in report

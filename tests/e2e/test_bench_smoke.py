"""`toolserve bench --quick` end to end on the tiny model: every system of the
quick size really starts (stock vLLM and toolserve in two interleaved rounds of
the many-agent workload, stock Ray Serve LLM beside toolserve on the hot path),
serves and stops, and the run's files are complete: provenance, intervals,
paired comparisons and the engines' own work counters. A system start costs a
minute or two, so each system starts only as often as these checks need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.records import RECORDS_FILE, open_records
from bench.report import PLOTS
from bench.stats import round_orders
from bench.systems import default_systems
from bench.workloads import plan_workload
from bench.workloads.hot_path import figure_names, phases
from cluster.config import REPO_ROOT

pytestmark = pytest.mark.e2e
QUICK_SYSTEMS = default_systems("quick")
ROUNDS_SYSTEMS = ("stock-vllm", "toolserve")
HOT_PATH_SYSTEMS = ("stock-ray-serve-llm", "toolserve")
PROGRAMS = 3
SERVER_PROCESSES = ("vllm.entrypoints", "bench.baselines.ray_serve_llm", "cluster.launch.cli up")


def _server_processes() -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [
        line for line in listing.stdout.splitlines() if any(s in line for s in SERVER_PROCESSES)
    ]


def test_the_two_tests_start_every_quick_system() -> None:
    assert set(ROUNDS_SYSTEMS) | set(HOT_PATH_SYSTEMS) == set(QUICK_SYSTEMS)


def test_quick_benchmark_on_the_tiny_model(tmp_path: Path) -> None:
    before = _server_processes()
    command = [
        sys.executable, "-m", "cluster.launch.cli", "bench", "--quick",
        "--systems", ",".join(ROUNDS_SYSTEMS), "--programs", str(PROGRAMS),
        "--model", "embedded:tiny-random-llama",
        "--output", str(tmp_path), "--name", "smoke", "--no-progress",
        "--repeats", "2", "--order-seed", "3",
        # Tests also run from working copies with changes; the record says so.
        "--allow-dirty",
    ]  # fmt: skip
    finished = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    run_dir = tmp_path / "smoke"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workload"] == "many-agent" and summary["size"] == "quick"
    assert summary["command"].startswith("toolserve bench --quick")
    provenance = summary["provenance"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance["commit"] == head and provenance["allow_dirty"]
    assert provenance["packages"]["ray"] and provenance["finished_utc"]
    assert summary["round_orders"] == round_orders(list(ROUNDS_SYSTEMS), 2, 3)
    assert list(summary["systems"]) == list(ROUNDS_SYSTEMS)
    for name, figures in summary["systems"].items():
        assert "error" not in figures, (name, figures)
        assert figures["rounds_completed"] == 2 and figures["failed_programs"] == 0, name
        assert figures["jct_mean_s"] > 0 and figures["tokens_per_s"] > 0
        mean = figures["intervals"]["jct_mean_s"]
        assert mean["low"] <= mean["estimate"] <= mean["high"]
        # Every system was configured to report cached prompt tokens.
        assert figures["prefix_reuse_rate"] is not None and figures["prefix_reuse_rate"] > 0
        assert figures["engine_prefix_hit_rate"] is not None, name
        work = figures["work"]
        # The engines' counters cover the workload's requests on every system alike.
        assert work["prompt_tokens"]["mean"] > 0 and work["generation_tokens"]["mean"] > 0, name
        assert work["prompt_tokens_from_cache"]["mean"] > 0, name
        assert work["cpu_engine_s"]["mean"] > 0, name
        assert work["cpu_total_s"]["mean"] >= work["cpu_engine_s"]["mean"], name
    pairs = {(c["reference"], c["system"]): c for c in summary["comparisons"]}
    assert set(pairs) == {("stock-vllm", "toolserve")}
    for comparison in pairs.values():
        ratio = comparison["jct_mean"]
        assert len(ratio["per_round"]) == 2 and ratio["programs"] == 2 * PROGRAMS
        assert ratio["low"] <= ratio["estimate"] <= ratio["high"]
    environments = {
        json.dumps(launch["environment"], sort_keys=True)
        for launch in summary["effective_configuration"].values()
    }
    assert len(environments) == 1
    assert summary["effective_configuration"]["toolserve"]["toolserve_config"]["main"]

    with open_records(run_dir) as lines:
        records = [json.loads(line) for line in lines]
    assert (run_dir / RECORDS_FILE).exists()
    programs = [r for r in records if r["kind"] == "program"]
    requests = [r for r in records if r["kind"] == "request"]
    assert {r["system"] for r in programs} == set(ROUNDS_SYSTEMS)
    per_system = len(programs) // len(ROUNDS_SYSTEMS)
    assert per_system == 2 * PROGRAMS and len(programs) == per_system * len(ROUNDS_SYSTEMS)
    # The same programs with the same turn counts on every system and round.
    turns = {(r["system"], r["repeat"], r["program_id"]): r["turns"] for r in programs}
    for (_, _, program_id), count in turns.items():
        assert count == turns[("stock-vllm", 0, program_id)]
    assert len(requests) == sum(turns.values())
    # toolserve names the replica of every turn; stock servers name none.
    for request in requests:
        assert (request["replica"] is not None) == request["system"].startswith("toolserve")

    for name in PLOTS.values():
        assert (run_dir / name).read_bytes().startswith(b"\x89PNG")
    console = (run_dir / "console.log").read_text()
    assert "bench: stock-vllm ready" in console and "bench: report at" in console
    report = (run_dir / "report.md").read_text()
    for name in ROUNDS_SYSTEMS:
        assert f"| {name} |" in report
    assert _server_processes() == before, "a system outlived the benchmark"


def test_hot_path_benchmark_on_the_tiny_model(tmp_path: Path) -> None:
    before = _server_processes()
    systems = HOT_PATH_SYSTEMS
    command = [
        sys.executable, "-m", "cluster.launch.cli", "bench", "--workload", "hot-path", "--quick",
        "--systems", ",".join(systems), "--model", "embedded:tiny-random-llama",
        "--output", str(tmp_path), "--name", "hot", "--no-progress", "--allow-dirty",
    ]  # fmt: skip
    finished = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    summary = json.loads((tmp_path / "hot" / "summary.json").read_text())
    config = plan_workload("hot-path", "quick").hot_path
    assert config is not None
    names = figure_names(config)
    for name in systems:
        figures = summary["systems"][name]
        assert figures["failed_programs"] == 0, (name, figures)
        assert figures["programs"] == len(phases(config))
        for figure in names:
            assert figures["hot_path"][figure]["mean"] > 0, (name, figure)
    (comparison,) = summary["comparisons"]
    assert set(comparison["hot_path"]) == set(names)
    assert (tmp_path / "hot" / RECORDS_FILE).exists()
    with open_records(tmp_path / "hot") as lines:
        records = [json.loads(line) for line in lines]
    expected = (
        config.sequential_requests
        + config.requests_per_phase * len(config.concurrency)
        + config.streamed_requests
    )
    for name in systems:
        requests = [r for r in records if r["kind"] == "request" and r["system"] == name]
        assert len(requests) == expected and not any(r["error"] for r in requests), name
    assert "## Hot path" in (tmp_path / "hot" / "report.md").read_text()
    assert _server_processes() == before, "a system outlived the benchmark"

"""`toolserve bench-sweep`: a concurrency sweep's runs gathered from their
summaries, refused when they are not one sweep, set out as a table and plotted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.sweep import (
    SweepError,
    SweepPoint,
    SweepRun,
    check_one_sweep,
    programs_per_round,
    read_sweep_runs,
    sweep_caption,
    sweep_points,
    sweep_table,
    write_sweep_plot,
)
from cluster.launch.cli import main

SYSTEMS = ("stock-vllm", "toolserve")


def _figures(hit_rate: float, ttft_p50: float | None, jct: float) -> dict[str, Any]:
    return {
        "programs": 16,
        "rounds_completed": 2,
        "engine_prefix_hit_rate": hit_rate,
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": None if ttft_p50 is None else 10 * ttft_p50,
        "intervals": {"jct_mean_s": {"estimate": jct, "low": jct - 1, "high": jct + 1}},
    }


def _summary(programs: int | None, **changes: Any) -> dict[str, Any]:
    """A sweep run's summary as `toolserve bench` writes it, reduced to what the
    sweep reads; stock vLLM's hit rate falls with the programs, toolserve's holds."""
    count = programs or 8
    summary: dict[str, Any] = {
        "workload": "trace-replay",
        "size": "default",
        "provenance": {"commit": "0123abc"},
        "settings": {"kv_cache_mib": 1536, "max_model_len": 8192},
        "systems": {
            "stock-vllm": _figures(8 / count, 0.05 * count, 10.0 * count),
            "toolserve": _figures(0.95, 0.04 * count, 8.0 * count),
        },
    }
    if programs is not None:
        summary["programs_per_round"] = programs
    return summary | changes


def _runs(*programs: int) -> list[SweepRun]:
    return [SweepRun(f"sweep-{count}", _summary(count)) for count in programs]


def test_each_system_gets_a_row_per_concurrency_in_order() -> None:
    points = sweep_points(_runs(32, 8, 16))
    assert [(point.system, point.programs) for point in points] == [
        (system, count) for system in SYSTEMS for count in (8, 16, 32)
    ]
    stock_at_32 = points[2]
    assert stock_at_32.prefix_hit_rate == 0.25
    assert stock_at_32.ttft_p50_s == pytest.approx(1.6)
    assert stock_at_32.ttft_p99_s == pytest.approx(16.0)
    assert stock_at_32.jct_mean == {"estimate": 320.0, "low": 319.0, "high": 321.0}


def test_the_table_shows_hit_rate_ttft_and_the_mean_jct_with_its_interval() -> None:
    table = sweep_table(sweep_points(_runs(8, 16)))
    assert table[0] == (
        "| system | programs | engine prefix-cache hit rate | TTFT p50 | TTFT p99 "
        "| mean JCT [95% CI] |"
    )
    assert table[2] == "| stock-vllm | 8 | 1.00 | 0.40 s | 4.00 s | 80.0 s [79.0, 81.0] |"
    assert table[5] == "| toolserve | 16 | 0.95 | 0.64 s | 6.40 s | 128.0 s [127.0, 129.0] |"


def test_figures_a_run_lacks_read_as_not_available() -> None:
    run = SweepRun("old", _summary(8))
    run.summary["systems"]["toolserve"] = _figures(0.9, None, 50.0) | {
        "engine_prefix_hit_rate": None
    }
    run.summary["systems"]["stock-vllm"] = {"error": "not ready after 900s"}
    table = sweep_table(sweep_points([run]))
    assert "| stock-vllm | 8 | failed: not ready after 900s | | | |" in table
    assert "| toolserve | 8 | n/a | n/a | n/a | 50.0 s [49.0, 51.0] |" in table


def test_a_run_from_before_summaries_said_its_programs_counts_them_by_round() -> None:
    run = SweepRun("old", _summary(None))
    run.summary["systems"]["stock-vllm"] = {"error": "failed"}
    assert programs_per_round(run) == 8
    assert programs_per_round(SweepRun("new", _summary(32))) == 32
    with pytest.raises(SweepError, match="no system completed a round"):
        programs_per_round(SweepRun("none", _summary(None, systems={"a": {"error": "x"}})))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"workload": "many-agent"}, "workload many-agent"),
        ({"size": "quick"}, "size quick"),
        ({"provenance": {"commit": "fedcba9"}}, "commit fedcba9"),
        ({"settings": {"kv_cache_mib": 384, "max_model_len": 8192}}, "KV budget"),
        ({"systems": {"toolserve": _figures(0.9, 0.1, 1.0)}}, "systems"),
    ],
)
def test_runs_that_are_not_one_sweep_are_refused(change: dict[str, Any], named: str) -> None:
    runs = [SweepRun("sweep-8", _summary(8)), SweepRun("other-16", _summary(16, **change))]
    with pytest.raises(SweepError, match=f"not one sweep: other-16 has {named}"):
        check_one_sweep(runs)


def test_two_runs_at_one_concurrency_are_refused() -> None:
    with pytest.raises(SweepError, match="sweep-16 and again both ran 16 programs"):
        check_one_sweep([*_runs(8, 16), SweepRun("again", _summary(16))])
    with pytest.raises(SweepError, match="name the sweep's runs"):
        check_one_sweep([])


def _write_runs(tmp_path: Path, *programs: int) -> list[Path]:
    paths = []
    for count in programs:
        run_dir = tmp_path / f"trace-replay-default-{count}-programs"
        run_dir.mkdir()
        (run_dir / "summary.json").write_text(json.dumps(_summary(count)))
        paths.append(run_dir)
    return paths


def test_runs_are_read_from_their_folders(tmp_path: Path) -> None:
    runs = read_sweep_runs(_write_runs(tmp_path, 8, 16))
    assert [run.name for run in runs] == [
        "trace-replay-default-8-programs",
        "trace-replay-default-16-programs",
    ]
    assert sweep_caption(runs) == (
        "Concurrency sweep: trace-replay (default) at commit 0123abc, KV cache 1536 MiB, "
        "max_model_len 8192; runs `trace-replay-default-8-programs`, "
        "`trace-replay-default-16-programs`."
    )
    with pytest.raises(SweepError, match="not a run's summary"):
        read_sweep_runs([tmp_path / "missing"])


def test_the_plot_has_a_line_per_system_in_three_panels(tmp_path: Path) -> None:
    points = [
        *sweep_points(_runs(8, 16, 32, 64)),
        # Figures a point lacks leave it out of that panel only.
        SweepPoint("toolserve-no-pinning", 8, None, None, None, None),
        SweepPoint("toolserve-no-pinning", 16, 0.5, 1.0, 2.0, {"estimate": 3.0}),
    ]
    write_sweep_plot(points, "trace-replay (default)", tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_the_command_prints_the_table_and_draws_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [str(path) for path in _write_runs(tmp_path, 16, 8)]
    plot = tmp_path / "sweep.png"
    assert main(["bench-sweep", *runs, "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Concurrency sweep: trace-replay (default)")
    assert "| toolserve | 8 | 0.95 | 0.32 s | 3.20 s | 64.0 s [63.0, 65.0] |" in printed
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_the_command_refuses_runs_of_different_commits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = _write_runs(tmp_path, 8, 16)
    changed = _summary(16, provenance={"commit": "fedcba9"})
    (second / "summary.json").write_text(json.dumps(changed))
    assert main(["bench-sweep", str(first), str(second)]) == 2
    assert "not one sweep" in capsys.readouterr().out

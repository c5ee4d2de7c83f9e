"""The performance figures of the README and the docs are the recorded ones:
every generated table equals what its runs' summaries give (its links rendered
for the page it is on), every cited run was recorded from a clean tree, and the
pages about benchmarks state no figure outside generated tables."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from bench.stats import round_ratio_interval
from bench.tables import (
    BLOCK,
    bench_table,
    cited_runs,
    pooled_table,
    stale_blocks,
    updated_blocks,
)
from cluster.config import REPO_ROOT

README = Path("README.md")
# Every page with a generated table, as a path from the repository's root.
PAGES_WITH_TABLES = [
    README,
    *sorted(
        page.relative_to(REPO_ROOT)
        for page in (REPO_ROOT / "docs").rglob("*.md")
        if BLOCK.search(page.read_text())
    ),
]
# A decimal figure with a unit: 1.30x, 1.3 times (the sign), 93.6%, 103.6 s.
FIGURE = re.compile("\\d+\\.\\d+\\s*(x\\b|\u00d7|%|s\\b)")


def _prose_about_results(page: Path) -> str:
    """The README's results section, or a whole docs page of benchmark results."""
    markdown = (REPO_ROOT / page).read_text()
    if page != README:
        return markdown
    start = markdown.index("## Results")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


def test_the_recorded_runs_and_benchmarks_pages_have_generated_tables() -> None:
    assert Path("docs/recorded-runs.md") in PAGES_WITH_TABLES
    assert README in PAGES_WITH_TABLES


@pytest.mark.parametrize("page", PAGES_WITH_TABLES, ids=str)
def test_every_generated_table_matches_its_runs(page: Path) -> None:
    markdown = (REPO_ROOT / page).read_text()
    assert cited_runs(markdown), f"{page} cites no recorded run"
    assert stale_blocks(markdown, REPO_ROOT, page) == [], (
        f"regenerate with `toolserve bench-table --update {page}`"
    )


@pytest.mark.parametrize("page", PAGES_WITH_TABLES, ids=str)
def test_cited_runs_were_recorded_from_a_clean_tree(page: Path) -> None:
    for run in cited_runs((REPO_ROOT / page).read_text()):
        provenance = json.loads((REPO_ROOT / run / "summary.json").read_text())["provenance"]
        assert provenance["commit"] and not provenance["dirty"], run
        assert not provenance["code_changed_during_run"], run


@pytest.mark.parametrize("page", [*PAGES_WITH_TABLES, Path("docs/benchmarks.md")], ids=str)
def test_results_are_stated_only_in_generated_tables(page: Path) -> None:
    prose = BLOCK.sub("", _prose_about_results(page))
    assert FIGURE.findall(prose) == [], [m.group(0) for m in FIGURE.finditer(prose)]


def _summary(ratio: float) -> dict[str, object]:
    interval = {"estimate": ratio, "low": ratio - 0.1, "high": ratio + 0.1}
    figures = {
        "intervals": {"jct_mean_s": {"estimate": 50.0, "low": 40.0, "high": 60.0}},
        "work": {
            "prompt_tokens_computed": {"mean": 1234.0},
            "prompt_tokens_from_cache": {"mean": 99.0},
            "preemptions": {"mean": 0.0},
            "cpu_total_s": {"mean": 10.0},
            "cpu_engine_s": {"mean": 8.0},
        },
    }
    return {
        "workload": "many-agent",
        "size": "default",
        "rounds": 3,
        "provenance": {"commit": "abcdef0123456789", "dirty": False},
        "comparisons": [
            {
                "reference": "stock-vllm",
                "system": "toolserve",
                "jct_mean": {
                    **interval,
                    "verdict": "faster" if ratio - 0.1 > 1 else "not resolved",
                },
                "jct_mean_less_client_stalls": None,
            }
        ],
        "systems": {"stock-vllm": figures, "toolserve": figures},
    }


def test_a_figure_that_differs_from_its_run_is_caught(tmp_path: Path) -> None:
    run = Path("bench/results/run-1")
    (tmp_path / run).mkdir(parents=True)
    (tmp_path / run / "summary.json").write_text(json.dumps(_summary(1.25)))
    table = bench_table([run], tmp_path)
    assert (
        "[run-1](bench/results/run-1/report.md) (many-agent, default, 3 rounds, `abcdef01`)"
        in table
    )
    assert "| toolserve | stock-vllm | 1.25x [1.15, 1.35] | faster | n/a | n/a |" in table
    assert "| toolserve | 50.0 s [40.0, 60.0] | 1,234 | 99 | 0 | 10 | 8 |" in table
    readme = f"<!-- bench-table {run} -->\n{table}<!-- /bench-table -->"
    assert stale_blocks(readme, tmp_path) == []
    assert stale_blocks(readme.replace("1.25x", "1.30x"), tmp_path) == [str(run)]
    (tmp_path / run / "summary.json").write_text(json.dumps(_summary(0.95)))
    assert stale_blocks(readme, tmp_path) == [str(run)]


def test_a_table_links_its_runs_from_the_page_it_is_on(tmp_path: Path) -> None:
    run = Path("bench/results/run-1")
    (tmp_path / run).mkdir(parents=True)
    (tmp_path / run / "summary.json").write_text(json.dumps(_summary(1.25)))
    page = Path("docs/recorded-runs.md")
    table = bench_table([run], tmp_path, page)
    assert "[run-1](../bench/results/run-1/report.md)" in table
    on_the_readme = (
        f"<!-- bench-table {run} -->\n{bench_table([run], tmp_path)}<!-- /bench-table -->"
    )
    assert stale_blocks(on_the_readme, tmp_path, page) == [str(run)]
    moved = updated_blocks(f"# Runs\n\n{on_the_readme}\n\nprose\n", tmp_path, page)
    assert moved == f"# Runs\n\n<!-- bench-table {run} -->\n{table}<!-- /bench-table -->\n\nprose\n"
    assert stale_blocks(moved, tmp_path, page) == []


def test_runs_recorded_before_intervals_cannot_be_cited(tmp_path: Path) -> None:
    run = Path("old")
    (tmp_path / run).mkdir()
    (tmp_path / run / "summary.json").write_text(json.dumps({"systems": {}}))
    with pytest.raises(ValueError, match="re-record it"):
        bench_table([run], tmp_path)


def test_a_run_cut_short_cannot_be_cited(tmp_path: Path) -> None:
    run = Path("partial")
    (tmp_path / run).mkdir()
    (tmp_path / run / "summary.json").write_text(
        json.dumps({**_summary(1.25), "rounds": 2, "rounds_planned": 3})
    )
    with pytest.raises(ValueError, match="only 2 of its rounds"):
        bench_table([run], tmp_path)


def test_a_hot_path_run_gets_its_own_table(tmp_path: Path) -> None:
    run = Path("hot")
    (tmp_path / run).mkdir()
    summary = _summary(0.9)
    summary["comparisons"][0]["hot_path"] = {  # type: ignore[index]
        "sequential_p50_ms": {"kind": "added_ms", "estimate": 24.0, "low": 20.0, "high": 28.0,
                              "per_round": [22.0, 24.0, 26.0]},
        "c8_requests_per_s": {"kind": "ratio", "estimate": 0.9, "low": 0.8, "high": 1.05,
                              "per_round": [0.85, 0.9, 0.95]},
    }  # fmt: skip
    (tmp_path / run / "summary.json").write_text(json.dumps(summary))
    table = bench_table([run], tmp_path)
    assert "| toolserve | stock-vllm | sequential_p50_ms | 24.0 ms [20.0, 28.0] | above |" in table
    assert "| toolserve | stock-vllm | c8_requests_per_s | 0.90x [0.80, 1.05] | not resolved |" in (
        table
    )
    assert "hot-path figure" not in bench_table([Path("bench/results/run-1")], _one_run(tmp_path))


def test_a_run_whose_engines_pinned_gets_a_retention_table(tmp_path: Path) -> None:
    run = Path("pinned")
    (tmp_path / run).mkdir()
    summary = _summary(1.1)
    pinned = summary["systems"]["toolserve"]  # type: ignore[index]
    summary["systems"]["toolserve"] = {  # type: ignore[index]
        **pinned,
        "work": {
            **pinned["work"],
            "pinned_token_s_used": {"mean": 3000.0},
            "pinned_token_s_wasted": {"mean": 1000.0},
        },
        "pinned_kv_reuse_rate": 0.9,
    }
    (tmp_path / run / "summary.json").write_text(json.dumps(summary))
    table = bench_table([run], tmp_path)
    assert "| toolserve | 3,000 | 1,000 | 25% | 90.0% |" in table
    assert "stock-vllm | 3,000" not in table
    assert "pinned token-s used" not in bench_table(
        [Path("bench/results/run-1")], _one_run(tmp_path)
    )


def _one_run(root: Path) -> Path:
    run = root / "bench/results/run-1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_summary(1.25)))
    return root


def _recorded_on(
    root: Path, name: str, per_round: list[float], day: str, programs: int = 32
) -> Path:
    run = Path("bench/results") / name
    (root / run).mkdir(parents=True)
    summary = _summary(1.0)
    ratio = summary["comparisons"][0]["jct_mean"]  # type: ignore[index]
    own = round_ratio_interval(per_round)
    assert own is not None
    ratio.update(own.as_json(), per_round=per_round)
    summary["programs_per_round"] = programs
    summary["provenance"] = {
        "commit": "abcdef0123456789",
        "dirty": False,
        "started_utc": f"{day}T23:15:26Z",
        "machine": {"cpu_model": "Intel(R) Xeon(R) Processor"},
    }
    (root / run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_pooled_table_pools_every_round_and_shows_each_run(tmp_path: Path) -> None:
    runs = [
        _recorded_on(tmp_path, "first", [2.02, 1.92], "2026-11-28"),
        _recorded_on(tmp_path, "second", [1.70, 1.80], "2026-11-29"),
    ]
    table = pooled_table(runs, tmp_path)
    pooled = math.exp(sum(map(math.log, [2.02, 1.92, 1.70, 1.80])) / 4)
    assert (
        f"| many-agent, default, 32 programs a round | toolserve | stock-vllm | {pooled:.2f}x ["
        in table
    )
    assert "| faster | 4 in 2 runs |" in table
    first_own = round_ratio_interval([2.02, 1.92])
    assert first_own is not None
    assert (
        f"[first](bench/results/first/report.md) {first_own.estimate:.2f}x "
        f"[{first_own.low:.2f}, {first_own.high:.2f}], Intel Xeon Processor, 2026-11-28"
    ) in table
    assert "Intel Xeon Processor, 2026-11-29 | yes |" in table
    page = f"<!-- bench-pool {runs[0]} {runs[1]} -->\n{table}<!-- /bench-pool -->"
    assert stale_blocks(page, tmp_path) == []
    assert cited_runs(page) == [str(run) for run in runs]
    assert stale_blocks(page.replace("| yes |", "| no |"), tmp_path) == [f"{runs[0]} {runs[1]}"]


def test_only_runs_of_one_shape_pool(tmp_path: Path) -> None:
    thirty_two = _recorded_on(tmp_path, "thirty-two", [2.0, 1.9], "2026-11-28")
    sixteen = _recorded_on(tmp_path, "sixteen", [1.0, 0.9], "2026-11-29", programs=16)
    with pytest.raises(ValueError, match="share workload, size and programs"):
        pooled_table([thirty_two, sixteen], tmp_path)
    with pytest.raises(ValueError, match="two runs or more"):
        pooled_table([thirty_two, thirty_two], tmp_path)

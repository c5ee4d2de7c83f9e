"""The benchmark tables of the README and the docs, generated from recorded runs'
summaries (`toolserve bench-table RUN...`), so no page can drift from the runs.

On a page a generated table sits between `<!-- bench-table RUN... -->` and
`<!-- /bench-table -->` (each run's comparisons and work), or between
`<!-- bench-pool RUN... -->` and `<!-- /bench-pool -->` (one workload's
comparisons pooled over its runs on several days and machines); a unit test
regenerates every such block for its page and compares
(`toolserve bench-table --update PAGE` rewrites them).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.markdown import markdown_table
from bench.records import ProgramRecord, open_records
from bench.report import (
    RETENTION_COLUMNS,
    format_interval,
    jct_ratio_by_agent_type_lines,
    retention_rows,
)
from bench.stats import Interval, pooled_round_ratio
from bench.summary import jct_ratio_by_agent_type
from bench.workloads.hot_path import ADDED

# Where a table's links start from unless told otherwise: the repository's root.
README = Path("README.md")
BLOCK = re.compile(
    r"<!-- (?P<kind>bench-table|bench-pool) (?P<runs>[^>]*?) -->\n(?P<body>.*?)"
    r"<!-- /(?P=kind) -->",
    re.DOTALL,
)


def _load(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    if "comparisons" not in summary or "provenance" not in summary:
        raise ValueError(
            f"{run_dir}: recorded before runs had rounds, intervals and provenance; "
            "re-record it to cite it"
        )
    if summary.get("rounds_planned", summary["rounds"]) > summary["rounds"]:
        raise ValueError(f"{run_dir}: only {summary['rounds']} of its rounds were recorded")
    return summary


def by_kind_table(run_dir: Path) -> str:
    """Each agent kind's mean JCT ratio, paired by round, from a recorded run's
    records (for runs recorded before their report gave it)."""
    summary = _load(run_dir)
    arms = list(summary["arms"])
    programs: dict[str, list[ProgramRecord]] = {label: [] for label in arms}
    with open_records(run_dir) as records:
        for line in records:
            record = json.loads(line)
            if record.pop("kind") == "program" and record["system"] in programs:
                try:
                    programs[record["system"]].append(ProgramRecord(**record))
                except TypeError as error:
                    raise ValueError(
                        f"{run_dir}: its records predate this table: {error}"
                    ) from None
    lines = jct_ratio_by_agent_type_lines(jct_ratio_by_agent_type(programs, summary["rounds"]))
    if not lines:
        raise ValueError(f"{run_dir}: its programs are all of one kind")
    return "\n".join(lines)


def _count(work: dict[str, Any], name: str) -> str:
    mean = work.get(name, {}).get("mean")
    return "n/a" if mean is None else f"{mean:,.0f}"


def _milliseconds(work: dict[str, Any], name: str) -> str:
    mean = work.get(name, {}).get("mean")
    return "n/a" if mean is None else f"{mean:.2f}"


def _report_link(run_dir: Path, page: Path) -> str:
    """The run's name linking to its report, relative to the page it is on."""
    report = Path(os.path.relpath(run_dir / "report.md", page.parent)).as_posix()
    return f"[{run_dir.name}]({report})"


def _run_cell(run_dir: Path, summary: dict[str, Any], page: Path) -> str:
    provenance = summary["provenance"]
    commit = (provenance["commit"] or "unknown")[:8] + (" dirty" if provenance["dirty"] else "")
    return (
        f"{_report_link(run_dir, page)} ({summary['workload']}, "
        f"{summary['size']}, {summary['rounds']} rounds, `{commit}`)"
    )


def bench_table(runs: Sequence[Path], root: Path = Path(), page: Path = README) -> str:
    """Markdown: each run's comparisons (ratio of mean JCT with its interval and
    verdict; where AIPerf drove the load, its own request-latency ratio beside it)
    and each system's work per round. `runs` are paths relative to `root` (the
    repository), and the links to their reports are relative to `page` (a path
    relative to `root` too), so they resolve from the page the table is on."""
    comparisons = [
        "| run | system | reference | mean JCT ratio [95% CI] | verdict "
        "| less client stalls [95% CI] | AIPerf's request latency ratio [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    work = [
        "| run | system | mean JCT [95% CI] | prompt tokens computed | from cache "
        "| preemptions | CPU s | engine CPU s | tokenize CPU ms per prompt |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    hot_path = [
        "| run | system | reference | hot-path figure | added ms or ratio [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    retention: list[list[str]] = []
    for run_dir in runs:
        summary = _load(root / run_dir)
        run = _run_cell(run_dir, summary, page)
        retention += [[run, *row] for row in retention_rows(summary)]
        for entry in summary["comparisons"]:
            for figure, value in (entry.get("hot_path") or {}).items():
                hot_path.append(
                    f"| {run} | {entry['system']} | {entry['reference']} | {figure} "
                    f"| {_hot_path_cell(value)} | {_hot_path_verdict(value)} |"
                )
            ratio = entry["jct_mean"]
            comparisons.append(
                f"| {run} | {entry['system']} | {entry['reference']} "
                f"| {format_interval(ratio, 'x', 2)} "
                f"| {ratio['verdict'] if ratio else 'n/a'} "
                f"| {format_interval(entry['jct_mean_less_client_stalls'], 'x', 2)} "
                f"| {format_interval(entry.get('aiperf_request_latency_mean'), 'x', 2)} |"
            )
        for name, figures in summary["systems"].items():
            if "error" in figures:
                work.append(f"| {run} | {name} | failed: {figures['error']} | | | | | | |")
                continue
            done = figures["work"]
            work.append(
                f"| {run} | {name} "
                f"| {format_interval(figures['intervals']['jct_mean_s'], ' s', 1)} "
                f"| {_count(done, 'prompt_tokens_computed')} "
                f"| {_count(done, 'prompt_tokens_from_cache')} | {_count(done, 'preemptions')} "
                f"| {_count(done, 'cpu_total_s')} | {_count(done, 'cpu_engine_s')} "
                f"| {_milliseconds(done, 'tokenize_cpu_ms_per_prompt')} |"
            )
    tables = [*comparisons, "", *work]
    if len(hot_path) > 2:
        tables += ["", *hot_path]
    if retention:
        tables += ["", *markdown_table(["run", "system", *RETENTION_COLUMNS], retention)]
    return "\n".join(tables) + "\n"


def _hot_path_cell(value: dict[str, Any]) -> str:
    if value["kind"] == ADDED:
        return format_interval(value, " ms", 1)
    return format_interval(value, "x", 2)


def _hot_path_verdict(value: dict[str, Any]) -> str:
    """Whether the interval leaves out no difference (0 ms added, a ratio of 1)."""
    interval = _interval_of(value)
    if interval is None:
        return "not resolved"
    neutral = 0.0 if value["kind"] == ADDED else 1.0
    if not interval.excludes(neutral):
        return "not resolved"
    return "above" if interval.low > neutral else "below"


def pooled_table(runs: Sequence[Path], root: Path = Path(), page: Path = README) -> str:
    """Markdown: every comparison two or more of `runs` (one workload, size and
    programs a round, recorded on different days or machines) made, pooled over
    all their rounds, beside each run's own estimate, machine and day."""
    if len(set(runs)) < 2 or len(set(runs)) < len(runs):
        raise ValueError("pooling needs two runs or more, each named once")
    summaries = [_load(root / run) for run in runs]
    shapes = {_shape(summary) for summary in summaries}
    if len(shapes) > 1:
        raise ValueError(f"pooled runs must share workload, size and programs a round: {shapes}")
    cited: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for run_dir, summary in zip(runs, summaries, strict=True):
        for entry in summary["comparisons"]:
            if entry["jct_mean"] and entry["jct_mean"].get("per_round"):
                cited.setdefault((entry["system"], entry["reference"]), []).append(
                    (_pooled_run_cell(run_dir, summary, entry["jct_mean"], page), entry["jct_mean"])
                )
    lines = [
        "| workload | system | reference | pooled mean JCT ratio [95% CI] | verdict "
        "| rounds | each run | runs agree |",
        "|---|---|---|---|---|---|---|---|",
    ]
    workload, size, programs = shapes.pop()
    shape = f"{workload}, {size}" + (f", {programs} programs a round" if programs else "")
    for (system, reference), runs_cited in cited.items():
        if len(runs_cited) < 2:
            continue
        pooled = pooled_round_ratio(
            [ratio["per_round"] for _, ratio in runs_cited],
            [_interval_of(ratio) for _, ratio in runs_cited],
        )
        assert pooled is not None, "two runs hold two rounds"
        lines.append(
            f"| {shape} | {system} | {reference} "
            f"| {format_interval(pooled.ratio.as_json(), 'x', 2)} | {pooled.verdict} "
            f"| {pooled.rounds} in {len(runs_cited)} runs "
            f"| {'; '.join(cell for cell, _ in runs_cited)} "
            f"| {'yes' if pooled.runs_agree else 'no'} |"
        )
    if len(lines) == 2:
        raise ValueError("no comparison was made by two of the runs")
    return "\n".join(lines) + "\n"


def _shape(summary: dict[str, Any]) -> tuple[str, str, object]:
    return (summary["workload"], summary["size"], summary.get("programs_per_round"))


def _interval_of(value: dict[str, Any]) -> Interval | None:
    """A summary's figure with its interval; None for a figure of one round."""
    if value["low"] is None or value["high"] is None:
        return None
    return Interval(value["estimate"], value["low"], value["high"])


def _pooled_run_cell(
    run_dir: Path, summary: dict[str, Any], ratio: dict[str, Any], page: Path
) -> str:
    provenance = summary["provenance"]
    machine = provenance.get("machine", {}).get("cpu_model") or "unknown CPU"
    day = (provenance.get("started_utc") or "unknown day")[:10]
    return (
        f"{_report_link(run_dir, page)} {format_interval(ratio, 'x', 2)}, "
        f"{machine.replace('(R)', '')}, {day}"
    )


def _block_table(block: re.Match[str], root: Path, page: Path) -> str:
    runs = [Path(run) for run in block["runs"].split()]
    if block["kind"] == "bench-pool":
        return pooled_table(runs, root, page)
    return bench_table(runs, root, page)


def stale_blocks(markdown: str, root: Path, page: Path = README) -> list[str]:
    """The runs of every generated block whose text differs from what the runs'
    summaries give now, rendered for `page` (relative to `root`)."""
    return [
        block["runs"]
        for block in BLOCK.finditer(markdown)
        if block["body"] != _block_table(block, root, page)
    ]


def updated_blocks(markdown: str, root: Path, page: Path = README) -> str:
    """`markdown` with every generated block rendered again for `page`."""
    return BLOCK.sub(
        lambda block: (
            f"<!-- {block['kind']} {block['runs']} -->\n"
            f"{_block_table(block, root, page)}<!-- /{block['kind']} -->"
        ),
        markdown,
    )


def cited_runs(markdown: str) -> list[str]:
    """Every run folder a generated block cites."""
    return [run for block in BLOCK.finditer(markdown) for run in block["runs"].split()]

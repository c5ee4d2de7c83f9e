"""`toolserve bench-sweep`: the runs of a concurrency sweep (one workload at one
size, run with `--programs N` for several N) side by side: per system and
concurrency the engine's prefix-cache hit rate, the time to first token and the
mean JCT, as a table and as plots against the programs a round."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.markdown import markdown_table
from bench.report import format_interval


class SweepError(ValueError):
    """The runs named are not one sweep, or a run cannot be read as part of one."""


@dataclass(frozen=True)
class SweepRun:
    """One run of the sweep: its folder's name and its summary."""

    name: str
    summary: dict[str, Any]


@dataclass(frozen=True)
class SweepPoint:
    """One system at one concurrency."""

    system: str
    programs: int
    prefix_hit_rate: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    jct_mean: dict[str, float | None] | None
    """The mean JCT with its interval, as the summary gives it."""
    error: str | None = None


def read_sweep_runs(run_dirs: Sequence[Path]) -> list[SweepRun]:
    runs = []
    for run_dir in run_dirs:
        path = run_dir / "summary.json"
        try:
            runs.append(SweepRun(run_dir.name, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError) as error:
            raise SweepError(f"{path}: not a run's summary ({error})") from error
    return runs


def programs_per_round(run: SweepRun) -> int:
    """The programs a round the run drove: as its summary says, or for a run
    recorded before summaries said it, its programs over its completed rounds."""
    summary = run.summary
    if summary.get("programs_per_round") is not None:
        return int(summary["programs_per_round"])
    for figures in summary["systems"].values():
        if figures.get("rounds_completed"):
            return int(figures["programs"]) // int(figures["rounds_completed"])
    raise SweepError(f"{run.name}: no system completed a round, so its programs are unknown")


def _shared_settings(run: SweepRun) -> dict[str, Any]:
    """What every run of one sweep has in common, by what a refusal names."""
    summary = run.summary
    settings = summary.get("settings") or {}
    return {
        "workload": summary.get("workload"),
        "size": summary.get("size"),
        "systems": sorted(summary.get("systems") or {}),
        "commit": (summary.get("provenance") or {}).get("commit"),
        "KV budget (MiB)": settings.get("kv_cache_mib"),
        "max_model_len": settings.get("max_model_len"),
    }


def _shown(value: Any) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)


def check_one_sweep(runs: Sequence[SweepRun]) -> None:
    """Refuses runs that are not one sweep: another workload, size, set of
    systems, commit or KV budget than the first run's, or two runs at the same
    programs a round."""
    if not runs:
        raise SweepError("name the sweep's runs")
    first = runs[0]
    expected = _shared_settings(first)
    for run in runs[1:]:
        for setting, value in _shared_settings(run).items():
            if value != expected[setting]:
                raise SweepError(
                    f"not one sweep: {run.name} has {setting} {_shown(value)}, "
                    f"{first.name} has {_shown(expected[setting])}"
                )
    seen: dict[int, str] = {}
    for run in runs:
        programs = programs_per_round(run)
        if programs in seen:
            raise SweepError(
                f"not one sweep: {seen[programs]} and {run.name} both ran {programs} programs"
            )
        seen[programs] = run.name


def sweep_points(runs: Sequence[SweepRun]) -> list[SweepPoint]:
    """Every system at every concurrency, systems in the first run's order and
    each by its programs a round (the runs checked as one sweep)."""
    check_one_sweep(runs)
    order = list(runs[0].summary["systems"])
    points = []
    for run in sorted(runs, key=programs_per_round):
        programs = programs_per_round(run)
        for system, figures in run.summary["systems"].items():
            if "error" in figures:
                points.append(
                    SweepPoint(system, programs, None, None, None, None, figures["error"])
                )
                continue
            points.append(
                SweepPoint(
                    system=system,
                    programs=programs,
                    prefix_hit_rate=figures.get("engine_prefix_hit_rate"),
                    ttft_p50_s=figures.get("ttft_p50_s"),
                    ttft_p99_s=figures.get("ttft_p99_s"),
                    jct_mean=(figures.get("intervals") or {}).get("jct_mean_s"),
                )
            )
    return sorted(points, key=lambda point: (order.index(point.system), point.programs))


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def sweep_table(points: Sequence[SweepPoint]) -> list[str]:
    """A row per system and concurrency (a failed system's names its error)."""
    rows = [
        [point.system, str(point.programs), f"failed: {point.error}"]
        if point.error is not None
        else [
            point.system,
            str(point.programs),
            _share(point.prefix_hit_rate),
            _seconds(point.ttft_p50_s),
            _seconds(point.ttft_p99_s),
            format_interval(point.jct_mean, " s"),
        ]
        for point in points
    ]
    return markdown_table(
        [
            "system",
            "programs",
            "engine prefix-cache hit rate",
            "TTFT p50",
            "TTFT p99",
            "mean JCT [95% CI]",
        ],
        rows,
    )


def sweep_title(runs: Sequence[SweepRun]) -> str:
    """The sweep's workload, size, commit and engine budget (the runs share them)."""
    settings = _shared_settings(runs[0])
    return (
        f"{settings['workload']} ({settings['size']}) at commit "
        f"{(settings['commit'] or 'unknown')[:12]}, KV cache {settings['KV budget (MiB)']} "
        f"MiB, max_model_len {settings['max_model_len']}"
    )


def sweep_caption(runs: Sequence[SweepRun]) -> str:
    """The line above the table: the title and the runs, by programs a round."""
    ordered = sorted(runs, key=programs_per_round)
    return (
        f"Concurrency sweep: {sweep_title(runs)}; runs "
        + ", ".join(f"`{run.name}`" for run in ordered)
        + "."
    )


def write_sweep_plot(points: Sequence[SweepPoint], title: str, path: Path) -> None:
    """Three panels against the programs a round, a line per system: the engine's
    prefix-cache hit rate, TTFT p99 (log axis: it can grow a hundredfold) and the
    mean JCT with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(point.system for point in points))
    concurrencies = sorted({point.programs for point in points})
    figure, (hits, ttft, jct) = plt.subplots(1, 3, figsize=(15, 4.5))
    for index, system in enumerate(systems):
        # One color a system in every panel, whichever figures it lacks.
        style = {"label": system, "color": f"C{index}", "marker": "o"}
        mine = [point for point in points if point.system == system and point.error is None]
        hit_rates = _present([(point.programs, point.prefix_hit_rate) for point in mine])
        if hit_rates:
            hits.plot(*zip(*hit_rates, strict=True), **style)
        ttft_p99 = _present([(point.programs, point.ttft_p99_s) for point in mine])
        if ttft_p99:
            ttft.plot(*zip(*ttft_p99, strict=True), **style)
        means = [(point.programs, point.jct_mean) for point in mine]
        estimated = [(x, i) for x, i in means if i and i.get("estimate") is not None]
        if estimated:
            xs, ys, errors = _with_error_bars(estimated)
            jct.errorbar(xs, ys, yerr=errors, capsize=3, **style)
    hits.set(ylabel="engine prefix-cache hit rate", ylim=(0, 1.05), title="Prefix-cache hits")
    ttft.set(ylabel="TTFT p99 (s)", yscale="log", title="Time to first token, p99")
    jct.set(ylabel="mean JCT (s)", title="Mean job completion time (95% CI)")
    for axes in (hits, ttft, jct):
        axes.set_xscale("log", base=2)
        axes.set_xticks(concurrencies, [str(count) for count in concurrencies])
        axes.set_xlabel("programs a round")
        axes.grid(alpha=0.3)
    jct.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _present(values: Sequence[tuple[int, float | None]]) -> list[tuple[int, float]]:
    return [(x, y) for x, y in values if y is not None and not math.isnan(y)]


def _with_error_bars(
    intervals: Sequence[tuple[int, dict[str, Any]]],
) -> tuple[list[int], list[float], list[list[float]]]:
    """Programs, estimates and the error bars to each interval's bounds (none
    where a run of one round has no interval)."""
    xs, ys, below, above = [], [], [], []
    for programs, interval in intervals:
        estimate = interval["estimate"]
        low, high = interval.get("low"), interval.get("high")
        xs.append(programs)
        ys.append(estimate)
        below.append(0.0 if low is None else estimate - low)
        above.append(0.0 if high is None else high - estimate)
    return xs, ys, [below, above]

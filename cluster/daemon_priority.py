"""Ray's own daemons, which serve no request, made to yield the CPU to the processes
that do (the engines, the ingress, the tool workers), on a Ray instance toolserve
started itself (locally, or as the nodes of `toolserve nodes`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

BACKGROUND_TITLES = (
    "ray::ServeController",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
)
"""Process titles of the Ray workers and agents no request passes through."""
IDLE_PROXY_TITLE = "ray::ProxyActor"
"""Serve's proxy, which Ray starts even where it receives no request: when the
ingress replica takes the API's requests itself, or on a node the clients do not
address."""
BACKGROUND_PROGRAMS = (
    "gcs_server",
    "ray/_private/log_monitor.py",
    "ray/autoscaler/_private/monitor.py",
    "ray/dashboard/dashboard.py",
)
"""Ray's head daemons, by the program they run. The raylet is not one of them: the
workers it starts (the engines') inherit its niceness."""


def is_background_daemon(command: Sequence[str], idle_proxy: bool) -> bool:
    """Whether a process of a Ray instance, by its command line, is one of Ray's
    daemons that serve no request; `idle_proxy`: Serve's proxy there is one."""
    if not command:
        return False
    title = command[0]
    if title.startswith(BACKGROUND_TITLES):
        return True
    if title.startswith(IDLE_PROXY_TITLE):
        return idle_proxy
    return _background_program(command) is not None


def _background_program(command: Sequence[str]) -> str | None:
    """The head daemon's program among the command's first words, if it runs one."""
    return next((part for part in command[:3] if part.endswith(BACKGROUND_PROGRAMS)), None)


def set_process_nice(pid: int, nice: int, proc: Path = Path("/proc")) -> bool:
    """Every thread of process `pid` at niceness `nice` (Linux keeps niceness per
    thread); False when the process is gone or the kernel refuses."""
    try:
        threads = [int(tid) for tid in os.listdir(proc / str(pid) / "task")]
    except OSError:
        return False
    changed = False
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            continue
        changed = True
    return changed


def yield_background_daemons(root_pid: int, nice: int, idle_proxy: bool) -> list[str]:
    """Sets each of Ray's background daemons among `root_pid`'s descendants to
    niceness `nice`; returns their names."""
    try:
        processes = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    return yield_daemons_among(processes, nice, idle_proxy)


def yield_daemons_among(
    processes: Iterable[psutil.Process], nice: int, idle_proxy: bool
) -> list[str]:
    """Sets each of Ray's background daemons among `processes` to niceness `nice`;
    returns their names."""
    niced = []
    for process in processes:
        try:
            command = process.cmdline()
        except psutil.Error:
            continue
        if is_background_daemon(command, idle_proxy) and set_process_nice(process.pid, nice):
            niced.append(_daemon_name(command))
    return sorted(niced)


def _daemon_name(command: Sequence[str]) -> str:
    if command[0].startswith("ray::"):
        return command[0].split()[0].split(".")[0]
    return Path(_background_program(command) or command[0]).name

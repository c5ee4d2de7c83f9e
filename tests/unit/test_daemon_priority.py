"""Ray's daemons that serve no request told apart by their command lines, and set
to a niceness on every thread of real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.daemon_priority import (
    is_background_daemon,
    set_process_nice,
    yield_background_daemons,
)

RAY = "/venv/lib/python3.11/site-packages/ray"


@pytest.mark.parametrize(
    "command",
    [
        ["ray::ServeController.listen_for_change"],
        ["ray::DashboardAgent"],
        ["ray::RuntimeEnvAgent"],
        [f"{RAY}/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray"],
        ["/venv/bin/python", "-u", f"{RAY}/_private/log_monitor.py", "--session-dir=/tmp"],
        ["/venv/bin/python", "-u", f"{RAY}/autoscaler/_private/monitor.py", "--logs-dir=/x"],
        ["/venv/bin/python", f"{RAY}/dashboard/dashboard.py", "--host=127.0.0.1"],
    ],
)
def test_rays_daemons_serve_no_request(command: list[str]) -> None:
    assert is_background_daemon(command, idle_proxy=True)
    assert is_background_daemon(command, idle_proxy=False)


@pytest.mark.parametrize(
    "command",
    [
        ["ray::ServeReplica:toolserve:openai-ingress"],
        ["ray::ServeReplica:toolserve:tool-workers"],
        ["VLLM::EngineCore"],
        ["VLLM::Worker"],
        [f"{RAY}/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/x"],
        ["/venv/bin/python", "-m", "cluster.launch.cli", "up"],
        ["/usr/bin/redis-server", "127.0.0.1:6379"],
        [],
    ],
)
def test_what_serves_requests_or_starts_the_engines_is_left_alone(command: list[str]) -> None:
    assert not is_background_daemon(command, idle_proxy=True)


def test_the_proxy_yields_only_while_the_ingress_replica_takes_the_requests() -> None:
    assert is_background_daemon(["ray::ProxyActor"], idle_proxy=True)
    assert not is_background_daemon(["ray::ProxyActor"], idle_proxy=False)


def _thread_nices(pid: int) -> list[int]:
    nices = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        nices.append(int(stat[stat.rindex(")") + 2 :].split()[16]))
    return nices


@pytest.fixture
def threaded_child() -> Iterator[subprocess.Popen[bytes]]:
    program = (
        "import threading, time, sys\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    yield child
    child.kill()
    child.wait()


def test_every_thread_of_the_process_gets_the_niceness(
    threaded_child: subprocess.Popen[bytes],
) -> None:
    nice = os.getpriority(os.PRIO_PROCESS, 0) + 3
    assert len(_thread_nices(threaded_child.pid)) == 2
    assert set_process_nice(threaded_child.pid, nice)
    assert _thread_nices(threaded_child.pid) == [nice, nice]


def test_a_process_that_is_gone_is_told_apart(tmp_path: Path) -> None:
    assert not set_process_nice(12345, 7, proc=tmp_path)


TITLES = ("ray::ServeController", "ray::ServeReplica:app:ingress", "ray::ProxyActor")


def test_only_the_daemons_among_the_descendants_yield() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    tree = " ".join(f"(exec -a {title} sleep 60) &" for title in TITLES) + " wait"
    parent = subprocess.Popen(["bash", "-c", tree], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(_titled_children(parent.pid)) < len(TITLES) and time.monotonic() < deadline:
            time.sleep(0.05)
        niced = yield_background_daemons(parent.pid, own + 4, idle_proxy=False)
        nices = {
            title: os.getpriority(os.PRIO_PROCESS, pid)
            for pid, title in _titled_children(parent.pid).items()
        }
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert niced == ["ray::ServeController"]
    assert nices == {
        "ray::ServeController": own + 4,
        "ray::ServeReplica:app:ingress": own,
        "ray::ProxyActor": own,
    }


def _titled_children(pid: int) -> dict[int, str]:
    titles = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode()
        if command.startswith("ray::"):
            titles[int(child)] = command
    return titles

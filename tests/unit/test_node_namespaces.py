"""The several-node fixture's checks that need no Ray: its profile names its head
and Redis, a profile that does not is refused before anything starts, and Ray's
daemons on each node's host yield the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from cluster.config import load_config
from cluster.launch.node_namespaces import NamespaceCluster, NamespaceClusterError
from cluster.node_layout import DEFAULT_NODES, NodeSpec, namespace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def test_the_shipped_profile_joins_the_cluster_the_nodes_make() -> None:
    cluster = NamespaceCluster()
    profile = load_config("multinode-cpu.yaml")
    cluster.check_profile(profile)
    assert cluster.api_root(profile) == "http://10.77.0.2:8000"
    # Another database of the nodes' Redis is the same cluster (the benchmark's).
    other_database = profile.redis.model_copy(update={"url": "redis://10.77.0.9:6379/9"})
    cluster.check_profile(profile.model_copy(update={"redis": other_database}))


def test_a_profile_naming_another_cluster_is_refused() -> None:
    local = load_config()
    with pytest.raises(NamespaceClusterError, match=r"ray\.address 10\.77\.0\.2:6379"):
        NamespaceCluster().check_profile(local)


def test_a_cluster_has_one_head() -> None:
    workers = [node for node in DEFAULT_NODES if not node.head]
    with pytest.raises(NamespaceClusterError, match="exactly one node is the head"):
        NamespaceCluster(nodes=workers)
    with pytest.raises(NamespaceClusterError, match="exactly one node is the head"):
        NamespaceCluster(nodes=[*DEFAULT_NODES, DEFAULT_NODES[0]])


HEAD = NodeSpec("nice-head", 250, num_cpus=1, head=True)
WORKER = NodeSpec("nice-work", 251, num_cpus=1)
TITLES = ("ray::ProxyActor", "ray::ServeController", "ray::ServeReplica:app:ingress")


@pytest.fixture
def titled_processes_on_two_hosts() -> Iterator[dict[int, tuple[str, str]]]:
    """On each of two hosts (network namespaces), processes titled as Ray's proxy,
    Serve's controller and a replica: {pid: (node, title)}."""
    tree = " ".join(f"(exec -a {title} sleep 60) &" for title in TITLES) + " wait"
    parents = []
    try:
        for node in (HEAD, WORKER):
            subprocess.run(["ip", "netns", "add", node.namespace], check=True)
            parents.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", node.namespace, "bash", "-c", tree],
                    start_new_session=True,
                )
            )
        titled: dict[int, tuple[str, str]] = {}
        deadline = time.monotonic() + 30
        while len(titled) < 2 * len(TITLES) and time.monotonic() < deadline:
            time.sleep(0.05)
            titled = {
                pid: (node.name, _title(pid))
                for node in (HEAD, WORKER)
                for pid in _pids(node.namespace)
                if _title(pid).startswith("ray::")
            }
        yield titled
    finally:
        for parent in parents:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        for node in (HEAD, WORKER):
            subprocess.run(["ip", "netns", "del", namespace(node.name)], check=False)


def test_each_hosts_daemons_yield_and_the_heads_proxy_does_not(
    titled_processes_on_two_hosts: dict[int, tuple[str, str]],
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    niced = NamespaceCluster(nodes=[HEAD, WORKER]).yield_daemons(own + 4)
    nices = {
        placed: os.getpriority(os.PRIO_PROCESS, pid)
        for pid, placed in titled_processes_on_two_hosts.items()
    }
    assert niced == [
        "ray::ServeController (nice-head)",
        "ray::ProxyActor (nice-work)",
        "ray::ServeController (nice-work)",
    ]
    assert nices == {
        ("nice-head", "ray::ProxyActor"): own,
        ("nice-head", "ray::ServeController"): own + 4,
        ("nice-head", "ray::ServeReplica:app:ingress"): own,
        ("nice-work", "ray::ProxyActor"): own + 4,
        ("nice-work", "ray::ServeController"): own + 4,
        ("nice-work", "ray::ServeReplica:app:ingress"): own,
    }


def _pids(ns: str) -> list[int]:
    listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")[0].decode()
    except OSError:
        return ""

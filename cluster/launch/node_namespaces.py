"""A Ray cluster of several nodes on one machine, each node a host of its own.

Every node runs in its own network namespace with its own address on a private
bridge; Redis runs in a namespace of its own; toolserve joins the head the way
it joins a KubeRay head (`ray.address`, Serve's HTTP proxy). Nodes share the
machine's file system and process table, not its network: a replica on another
node is reached over the bridge, and killing a namespace's processes loses a
node the way a dead pod does. Needs root (`ip netns`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx
import psutil

from cluster.config import ToolserveConfig, load_config
from cluster.daemon_priority import yield_daemons_among
from cluster.launch.debian_packages import binary_or_install
from cluster.node_layout import (
    DASHBOARD_PORT,
    DEFAULT_NODES,
    METRICS_PORT,
    RAY_PORT,
    REDIS_HOST,
    REDIS_PORT,
    SUBNET,
    NodeSpec,
    namespace,
)

Log = Callable[[str], None]

BRIDGE = "tsnodes0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
RAY_TEMP_ROOT = Path("/tmp/tsn-ray")
"""Short: Ray's Unix sockets live under it, and their paths may not pass 107 bytes."""
REDIS_NAMESPACE = "redis"


class NamespaceClusterError(RuntimeError):
    """A node could not be created, started or stopped."""


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NamespaceClusterError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def _namespace_pids(name: str) -> list[int]:
    result = _run(["ip", "netns", "pids", namespace(name)], check=False)
    return [int(pid) for pid in result.stdout.split()] if result.returncode == 0 else []


def _host_side(name: str) -> str:
    """The host's end of a node's link to the bridge."""
    return f"tsv-{name}"[:15]  # the kernel's limit on interface names


def _reachable(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


class NamespaceCluster:
    """Creates the bridge and namespaces, starts Redis and the Ray nodes, and
    stops, kills, restarts and partitions them by name."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec] = DEFAULT_NODES,
        work_dir: Path = Path("/tmp/toolserve-nodes"),
        log: Log = print,
    ):
        if os.geteuid() != 0:
            raise NamespaceClusterError("network namespaces need root")
        if [node.head for node in nodes].count(True) != 1:
            raise NamespaceClusterError("exactly one node is the head")
        self.nodes = {node.name: node for node in nodes}
        self.work_dir = work_dir
        self._log = log
        self._redis: subprocess.Popen[bytes] | None = None

    @property
    def head(self) -> NodeSpec:
        return next(node for node in self.nodes.values() if node.head)

    @property
    def ray_address(self) -> str:
        return f"{self.head.address}:{RAY_PORT}"

    @property
    def redis_url(self) -> str:
        return f"redis://{SUBNET}.{REDIS_HOST}:{REDIS_PORT}/0"

    def metrics_targets(self) -> list[str]:
        """Every node's metrics agent, as Prometheus targets."""
        return [f"{node.address}:{METRICS_PORT}" for node in self.nodes.values()]

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head.address}:{DASHBOARD_PORT}"

    def placement(self) -> list[dict[str, str]]:
        """Every live actor's class, name and node address, from Ray's state API."""
        headers = {"Authorization": f"Bearer {self.auth_token_path.read_text().strip()}"}
        get = functools.partial(httpx.get, headers=headers, timeout=30)
        nodes = get(f"{self.dashboard_url}/api/v0/nodes?limit=1000").json()
        listed = nodes["data"]["result"]["result"]
        address_of = {node["node_id"]: node["node_ip"] for node in listed}
        actors = get(
            f"{self.dashboard_url}/api/v0/actors?limit=10000&filter_keys=state"
            "&filter_predicates=%3D&filter_values=ALIVE"
        ).json()
        return [
            {
                "class_name": actor["class_name"],
                "name": actor.get("name") or "",
                "node": address_of.get(actor["node_id"], ""),
            }
            for actor in actors["data"]["result"]["result"]
        ]

    @property
    def auth_token_path(self) -> Path:
        return self.work_dir / "ray-auth-token"

    def environment(self) -> dict[str, str]:
        """What a process joining the cluster needs: Ray's token authentication,
        with the cluster's own token."""
        return {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.auth_token_path),
            "RAY_worker_niceness": "0",
        }

    def create_hosts(self) -> None:
        """The bridge and every node's namespace with its address, nothing running
        in them yet (what was there before is stopped and removed)."""
        self.down()
        self._log(f"nodes: bridge {BRIDGE} {BRIDGE_ADDRESS}/24")
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        self._add_namespace(REDIS_NAMESPACE, f"{SUBNET}.{REDIS_HOST}")
        for node in self.nodes.values():
            self._add_namespace(node.name, node.address)

    def up(self) -> None:
        self.create_hosts()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.auth_token_path.write_text(secrets.token_hex(32))
        self.auth_token_path.chmod(0o600)
        try:
            self.start_redis()
            self.start_node(self.head.name)
            for node in self.nodes.values():
                if not node.head:
                    self.start_node(node.name)
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        for name in [*self.nodes, REDIS_NAMESPACE]:
            self.kill(name)
            _run(["ip", "netns", "del", namespace(name)], check=False)
            # A namespace outlives `ip netns del` while a process still holds it,
            # and its link's host side with it: the next `up` would find it there.
            _run(["ip", "link", "del", _host_side(name)], check=False)
        _run(["ip", "link", "del", BRIDGE], check=False)
        self._redis = None

    def _add_namespace(self, name: str, address: str) -> None:
        ns = namespace(name)
        host_side = _host_side(name)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", host_side, "master", BRIDGE, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _exec(self, name: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", namespace(name), *argv]

    def start_redis(self) -> None:
        binary = binary_or_install("redis-server", "redis-server", self._log)
        address = f"{SUBNET}.{REDIS_HOST}"
        argv = [binary, "--bind", address, "--port", str(REDIS_PORT), "--save", ""]
        argv += ["--appendonly", "no", "--protected-mode", "no"]
        with self._log_file("redis") as log_file:
            self._redis = subprocess.Popen(
                self._exec(REDIS_NAMESPACE, argv),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_reachable(address, REDIS_PORT, "redis", 30)

    def start_node(self, name: str) -> None:
        node = self.nodes[name]
        ray = str(Path(sys.executable).parent / "ray")
        argv = [ray, "start", f"--node-ip-address={node.address}"]
        argv += [f"--num-cpus={node.num_cpus}", "--num-gpus=0"]
        argv += [f"--metrics-export-port={METRICS_PORT}"]
        argv += [f"--resources={json.dumps(node.resources)}"]
        argv += [f"--temp-dir={RAY_TEMP_ROOT / name}", "--disable-usage-stats"]
        if node.head:
            # The dashboard answers Ray's state API (where each actor runs), as on
            # a KubeRay head.
            argv += ["--head", f"--port={RAY_PORT}", f"--dashboard-host={node.address}"]
        else:
            argv += [f"--address={self.ray_address}"]
        self._log(f"nodes: {name} at {node.address}")
        result = subprocess.run(
            self._exec(name, argv), capture_output=True, text=True, env=self.environment()
        )
        if result.returncode != 0:
            raise NamespaceClusterError(f"ray start on {name} failed: {result.stderr[-2000:]}")

    def yield_daemons(self, nice: int) -> list[str]:
        """Sets Ray's daemons that serve no request on every node to niceness
        `nice`, Serve's proxies on the nodes other than the head among them (the
        clients address the head's); returns their names, each with its node."""
        niced = []
        for node in self.nodes.values():
            processes = []
            for pid in _namespace_pids(node.name):
                with contextlib.suppress(psutil.Error):  # gone since listed
                    processes.append(psutil.Process(pid))
            daemons = yield_daemons_among(processes, nice, idle_proxy=not node.head)
            niced += [f"{daemon} ({node.name})" for daemon in daemons]
        return niced

    def kill(self, name: str) -> None:
        """Every process of the namespace, at once (a node lost, not stopped)."""
        pids = _namespace_pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _namespace_pids(name) and time.monotonic() < deadline:
            time.sleep(0.1)

    @contextlib.contextmanager
    def partitioned(self, name: str) -> Iterator[None]:
        """The namespace cut off the bridge while the block runs."""
        ns = namespace(name)
        _run(["ip", "-n", ns, "link", "set", "eth0", "down"])
        try:
            yield
        finally:
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def check_profile(self, config: ToolserveConfig) -> None:
        """A profile joins this cluster only if it names its head and Redis (any of
        its databases)."""
        same_redis = urlsplit(config.redis.url).netloc == urlsplit(self.redis_url).netloc
        if config.ray.address != self.ray_address or not same_redis:
            raise NamespaceClusterError(
                f"the profile must name this cluster: ray.address {self.ray_address} "
                f"(it has {config.ray.address}), redis.url {self.redis_url} "
                f"(it has {config.redis.url})"
            )
        if config.server.ingress != "proxy":
            raise NamespaceClusterError("the profile must use server.ingress: proxy")

    def api_root(self, config: ToolserveConfig) -> str:
        return f"http://{self.head.address}:{config.server.port}"

    def serve(self, config_path: Path) -> subprocess.Popen[bytes]:
        """`toolserve up` on the head node, as one runs it in KubeRay's head pod."""
        self.check_profile(load_config(config_path))
        toolserve = str(Path(sys.executable).parent / "toolserve")
        return self.popen_in(self.head.name, [toolserve, "up", "--config", str(config_path)], "up")

    def wait_until_serving(
        self, config: ToolserveConfig, server: subprocess.Popen[bytes], timeout_s: float
    ) -> None:
        """Until `/health` says ok over the bridge; the server's exit ends the wait."""
        url = f"{self.api_root(config)}/health"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise NamespaceClusterError(
                    f"toolserve up exited ({server.returncode}); see {self.log_path('up')}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(url, timeout=5).json().get("status") == "ok":
                    return
            time.sleep(1)
        raise NamespaceClusterError(f"{url} not ok after {timeout_s:.0f}s")

    def popen_in(
        self, name: str, argv: Sequence[str], log_name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A process in a node's namespace (e.g. `toolserve up` on the head, as
        one would run it in KubeRay's head pod)."""
        with self._log_file(log_name) as log_file:
            return subprocess.Popen(
                self._exec(name, argv),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**self.environment(), **(env or {})},
                start_new_session=True,
            )

    def log_path(self, name: str) -> Path:
        return self.work_dir / "logs" / f"{name}.log"

    def _log_file(self, name: str) -> IO[bytes]:
        path = self.log_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab")

    def _wait_reachable(self, address: str, port: int, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not _reachable(address, port):
            if time.monotonic() > deadline:
                raise NamespaceClusterError(f"{what} at {address}:{port} never answered")
            time.sleep(0.2)

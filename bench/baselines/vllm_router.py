"""Stock vLLM's two-replica deployment: `vllm-router` (vLLM's Rust router) with
consistent-hash session affinity on `X-Session-ID`, optionally its program
scheduling, in front of one vLLM OpenAI server per replica, each bound to its
own cores. Serves the replicas' metrics summed on one port (their scrapes
concatenated). `--on-nodes`: each replica on a model node of `toolserve nodes`
and the router on its head, each in that node's namespace. Runs until SIGTERM or
SIGINT, then stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bench.systems import (
    ROUTER_READY_LINE,
    EngineSettings,
    replica_environment,
    stock_vllm_command,
    toolserve_command,
)
from cluster.net import free_port
from cluster.node_layout import head_node, model_nodes
from cluster.signals import stop_on_signals

# Program identity from the `X-Session-ID` the agents send (`auto`): the default
# opt-in key is an `agentic_context` object in `vllm_xargs`, which stock vLLM's
# request validation refuses (it takes flat values only).
PROGRAM_SCHEDULING_CONFIG = {"program_scheduling_enable_key": "auto", "global_queue": True}
_STARTUP_TIMEOUT_S = 900.0


def router_command(
    worker_urls: list[str],
    port: int,
    prometheus_port: int,
    program_scheduling: bool,
    host: str = "127.0.0.1",
) -> list[str]:
    command = [
        sys.executable, "-m", "vllm_router.launch_router",
        "--worker-urls", *worker_urls,
        "--host", host, "--port", str(port),
        "--policy", "consistent_hash",
        "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
        "--worker-startup-timeout-secs", str(int(_STARTUP_TIMEOUT_S)),
        "--worker-startup-check-interval", "2",
    ]  # fmt: skip
    if program_scheduling:
        command += [
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            json.dumps(PROGRAM_SCHEDULING_CONFIG),
        ]
    return command


@dataclass(frozen=True)
class _Host:
    """Where a process runs: this machine's loopback, or a node's namespace."""

    address: str = "127.0.0.1"
    namespace: str | None = None

    def run(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv] if self.namespace else argv


def _replica_hosts(replicas: int, on_nodes: bool) -> list[_Host]:
    """One host per replica: the model nodes (created here, as `toolserve nodes
    hosts` does), or the loopback for all."""
    if not on_nodes:
        return [_Host()] * replicas
    nodes = model_nodes()
    if replicas != len(nodes):
        raise SystemExit(f"{replicas} replicas for {len(nodes)} model nodes: one each")
    subprocess.run(toolserve_command("nodes", "hosts"), check=True)
    return [_Host(node.address, node.namespace) for node in nodes]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the process serving {url} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(2.0)
    raise RuntimeError(f"{url} not healthy after {timeout_s:.0f}s")


def _serve_summed_metrics(port: int, metrics_urls: list[str]) -> ThreadingHTTPServer:
    """Every replica's scrape, one after another: counters sum over replicas in
    the benchmark's reading, as they do over Ray Serve's replicas."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            texts = []
            for url in metrics_urls:
                with contextlib.suppress(httpx.HTTPError):
                    texts.append(httpx.get(url, timeout=10).text)
            body = "\n".join(texts).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", type=Path, required=True, help="EngineSettings JSON")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument(
        "--bindings", nargs="+", required=True, help="cores of each replica's engine"
    )
    parser.add_argument("--program-scheduling", action="store_true")
    parser.add_argument(
        "--on-nodes",
        action="store_true",
        help="on the hosts of `toolserve nodes`: a replica per model node, the router "
        "on the head (creates the hosts, removes them at the end)",
    )
    args = parser.parse_args()
    settings = EngineSettings(**json.loads(args.settings.read_text()))
    stop_on_signals()
    processes: list[subprocess.Popen[bytes]] = []
    metrics_server: ThreadingHTTPServer | None = None
    hosts = _replica_hosts(len(args.bindings), args.on_nodes)
    router_host = _Host(head_node().address, head_node().namespace) if args.on_nodes else _Host()
    try:
        worker_urls = []
        for binding, host in zip(args.bindings, hosts, strict=True):
            port = free_port()
            worker_urls.append(f"http://{host.address}:{port}")
            processes.append(
                subprocess.Popen(
                    host.run(stock_vllm_command(settings, port, host.address)),
                    env=replica_environment(settings, binding),
                )
            )
        for url, process in zip(worker_urls, processes, strict=True):
            _wait_healthy(url, process, _STARTUP_TIMEOUT_S)
        routing = router_command(
            worker_urls, args.port, free_port(), args.program_scheduling, router_host.address
        )
        router = subprocess.Popen(router_host.run(routing))
        processes.append(router)
        _wait_healthy(f"http://{router_host.address}:{args.port}", router, _STARTUP_TIMEOUT_S)
        metrics_server = _serve_summed_metrics(
            args.metrics_port, [f"{url}/metrics" for url in worker_urls]
        )
        print(f"{ROUTER_READY_LINE}: {len(worker_urls)} replicas", flush=True)
        while all(process.poll() is None for process in processes):
            time.sleep(1.0)
        raise RuntimeError("a replica or the router exited")
    except KeyboardInterrupt:
        pass
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
            if process.poll() is None:
                process.kill()
        if args.on_nodes:
            subprocess.run(toolserve_command("nodes", "down"), check=False)


if __name__ == "__main__":
    main()

"""Stock vLLM's two-replica deployment: `vllm-router` (vLLM's Rust router) with
consistent-hash session affinity on `X-Session-ID`, optionally its program
scheduling, in front of one vLLM OpenAI server per replica, each bound to its
own cores. Serves the replicas' metrics summed on one port (their scrapes
concatenated). Runs until SIGTERM or SIGINT, then stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bench.systems import (
    ROUTER_READY_LINE,
    EngineSettings,
    replica_environment,
    stock_vllm_command,
)
from cluster.net import free_port
from cluster.signals import stop_on_signals

# Program identity from the `X-Session-ID` the agents send (`auto`): the default
# opt-in key is an `agentic_context` object in `vllm_xargs`, which stock vLLM's
# request validation refuses (it takes flat values only).
PROGRAM_SCHEDULING_CONFIG = {"program_scheduling_enable_key": "auto", "global_queue": True}
_STARTUP_TIMEOUT_S = 900.0


def router_command(
    worker_urls: list[str], port: int, prometheus_port: int, program_scheduling: bool
) -> list[str]:
    command = [
        sys.executable, "-m", "vllm_router.launch_router",
        "--worker-urls", *worker_urls,
        "--host", "127.0.0.1", "--port", str(port),
        "--policy", "consistent_hash",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port),
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
    args = parser.parse_args()
    settings = EngineSettings(**json.loads(args.settings.read_text()))
    stop_on_signals()
    processes: list[subprocess.Popen[bytes]] = []
    metrics_server: ThreadingHTTPServer | None = None
    try:
        worker_urls = []
        for binding in args.bindings:
            port = free_port()
            worker_urls.append(f"http://127.0.0.1:{port}")
            processes.append(
                subprocess.Popen(
                    stock_vllm_command(settings, port),
                    env=replica_environment(settings, binding),
                )
            )
        for url, process in zip(worker_urls, processes, strict=True):
            _wait_healthy(url, process, _STARTUP_TIMEOUT_S)
        router = subprocess.Popen(
            router_command(worker_urls, args.port, free_port(), args.program_scheduling)
        )
        processes.append(router)
        _wait_healthy(f"http://127.0.0.1:{args.port}", router, _STARTUP_TIMEOUT_S)
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


if __name__ == "__main__":
    main()

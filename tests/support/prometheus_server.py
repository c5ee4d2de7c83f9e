"""A real Prometheus (Debian's package, installed when missing) scraping the
cluster's metrics endpoint, for tests that evaluate the dashboards' queries."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from cluster.launch.debian_packages import binary_or_install
from cluster.net import free_port


class PrometheusServer:
    def __init__(self, work_dir: Path, metrics_target: str, scrape_interval_s: int = 2):
        self.url = ""
        self._work_dir = work_dir
        self._target = metrics_target
        self._interval = scrape_interval_s
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = binary_or_install("prometheus", "prometheus", print)
        config = self._work_dir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {self._interval}s\n"
            "scrape_configs:\n  - job_name: toolserve\n"
            f"    static_configs:\n      - targets: ['{self._target}']\n"
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = (self._work_dir / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self._work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"prometheus did not get ready; see {self._work_dir}/prometheus.log")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a query Prometheus refuses)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = answer.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('error')}")
        return list(body["data"]["result"])

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()

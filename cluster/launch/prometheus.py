"""A local Prometheus (Debian's package, installed when missing) for the
dashboards: it scrapes the targets listed in `<work_dir>/targets.json`
(Prometheus's file-based discovery, so the list may change while it runs).
`toolserve dashboards prometheus DIR` runs one in the foreground and prints
its URL, alone on stdout, once it is ready."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from cluster.launch.debian_packages import binary_or_install
from cluster.net import free_port


class PrometheusServer:
    def __init__(
        self,
        work_dir: Path,
        targets: Sequence[str] = (),
        scrape_interval_s: float = 2,
        port: int | None = None,
    ):
        self.url = ""
        self.scrape_interval_s = scrape_interval_s
        self._work_dir = work_dir
        self._port = port
        self._targets_file = work_dir / "targets.json"
        self._initial_targets = list(targets)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = binary_or_install(
            "prometheus", "prometheus", lambda line: print(line, file=sys.stderr)
        )
        self._work_dir.mkdir(parents=True, exist_ok=True)
        self.set_targets(self._initial_targets)
        config = self._work_dir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {self.scrape_interval_s:g}s\n"
            "scrape_configs:\n  - job_name: toolserve\n"
            # Prometheus reads a relative path from the configuration's folder.
            f"    file_sd_configs:\n      - files: ['{self._targets_file.resolve()}']\n"
        )
        port = self._port or free_port()
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
            if self._process.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"prometheus did not get ready; see {self._work_dir}/prometheus.log")

    def set_targets(self, targets: Sequence[str], labels: dict[str, str] | None = None) -> None:
        """Scrape these `host:port`s from now on (written atomically: Prometheus
        reads the file whenever it changes)."""
        groups = [{"targets": list(targets), "labels": labels or {}}] if targets else []
        staged = self._targets_file.with_suffix(".tmp")
        staged.write_text(json.dumps(groups) + "\n")
        staged.replace(self._targets_file)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a query Prometheus refuses)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = answer.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('error')}")
        return list(body["data"]["result"])

    def wait(self) -> int:
        if self._process is None:
            raise RuntimeError("prometheus was not started")
        return self._process.wait()

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()

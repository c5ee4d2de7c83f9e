"""`toolserve bench --dashboards`: a local Prometheus (`toolserve dashboards
prometheus`) scrapes each toolserve arm while it runs, and `toolserve dashboards
render` draws the dashboards over the arm's run, as a user would with the CLI."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

from bench.systems import toolserve_command

_SCRAPE_INTERVAL_S = 5
_CLI = toolserve_command("dashboards")


class DashboardCapture:
    def __init__(self, run_dir: Path, log: Callable[[str], None]):
        self._work_dir = run_dir / "prometheus"
        self._drawn_dir = run_dir / "dashboards"
        self._log = log
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """The command prints Prometheus's URL once it is ready (or exits)."""
        self._work_dir.mkdir(parents=True, exist_ok=True)
        self._command_log = (self._work_dir / "command.log").open("wb")
        self._process = subprocess.Popen(
            [
                *_CLI,
                "prometheus",
                str(self._work_dir),
                "--scrape-interval",
                str(_SCRAPE_INTERVAL_S),
            ],
            stdout=subprocess.PIPE,
            stderr=self._command_log,
            text=True,
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError(f"Prometheus did not start; see {self._work_dir}/command.log")
        self._log(f"bench: dashboards: Prometheus at {self.url}")

    def watch(self, metrics_url: str | None, label: str = "") -> None:
        """Scrape this arm's metrics endpoint from now on (None: nothing)."""
        groups = (
            [{"targets": [urlparse(metrics_url).netloc], "labels": {"arm": label}}]
            if metrics_url
            else []
        )
        staged = self._work_dir / "targets.tmp"
        staged.write_text(json.dumps(groups) + "\n")
        staged.replace(self._work_dir / "targets.json")

    def draw(self, tag: str, start: datetime, end: datetime) -> None:
        """The dashboards over [start, end] into dashboards/<tag>/; a failure is
        logged, the run goes on."""
        time.sleep(2 * _SCRAPE_INTERVAL_S)
        drawn = subprocess.run(
            [
                *_CLI,
                "render",
                str(self._drawn_dir / tag),
                "--prometheus-url",
                self.url,
                "--start",
                start.isoformat(),
                "--end",
                end.isoformat(),
                "--step",
                "5",
            ],
            capture_output=True,
            text=True,
        )
        if drawn.returncode != 0:
            self._log(f"bench: dashboards of {tag} not drawn: {drawn.stderr.strip()[-300:]}")
            return
        answers = [
            answer
            for path in sorted((self._drawn_dir / tag).glob("*.json"))
            for answer in json.loads(path.read_text())["queries"]
        ]
        filled = sum(bool(answer["result"]) for answer in answers)
        self._log(
            f"bench: dashboards of {tag} in {self._drawn_dir / tag}: "
            f"{filled} of {len(answers)} queries returned data"
        )

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._command_log.close()
